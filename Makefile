# Both targets create the virtual environment they need, then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run test lint bench clean compat compat-ci

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]'
	rm -f $(VENV)/.installed-*; touch $@

run: $(STAMP)
	$(VENV)/bin/oncelog serve --log-dirs ./data --override metrics.port=9404

lint: $(STAMP)
	$(VENV)/bin/lint-imports

test: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -p no:cacheprovider --durations=15

# the tests that start no other process and no Spark session (tests/conftest.py marks the others)
.PHONY: test-fast
test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not processes and not spark and not slow" --durations=10

# librdkafka's own test suite against `oncelog serve` (compat/librdkafka/README.md): the first
# run fetches and builds librdkafka's test runner (about 3 min on 2 cores), later runs reuse it
compat: $(STAMP)
	$(PY) compat/librdkafka/run.py

# the CI-sized subset (compat/librdkafka/tests.ci)
compat-ci: $(STAMP)
	$(PY) compat/librdkafka/run.py --subset ci

clean:
	rm -rf $(VENV) data
