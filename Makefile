# Each target creates the virtual environment it needs, then runs: `make run` installs oncelog
# alone (what serving needs), `make test` adds the test and benchmark extras. A stamp per level,
# named after pyproject.toml's checksum, says what is installed; an edit of pyproject.toml
# installs again.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CHECKSUM := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
RUN_STAMP := $(VENV)/.installed-run-$(CHECKSUM)
TEST_STAMP := $(VENV)/.installed-test-$(CHECKSUM)

.PHONY: run test test-all test-nightly install-test lint bench clean compat compat-ci

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(RUN_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e .
	rm -f $(VENV)/.installed-run-*; touch $@

# The test extras include everything `run` installs. Spark puts $$SPARK_HOME/python/lib/pyspark.zip
# first on its Python workers' PYTHONPATH; for a pip-installed pyspark that is a copy of the
# installed package, imported from the zip without bytecode, so every worker start compiled
# pyspark again: 2.2 CPU-s instead of 0.7, for each of the several workers a streaming query
# starts (and Spark gives a worker 10 s to connect back). Moved aside, the workers import the
# installed pyspark, the same version, compiled: test_streaming.py took 142 s instead of 217.
PYSPARK_ZIP_ASIDE := for z in $(VENV)/lib/python*/site-packages/pyspark/python/lib/pyspark.zip; do \
	if [ -f "$$z" ]; then mv "$$z" "$$z.unused"; fi; done
# --no-compile: pip would byte-compile all ~6,900 modules it installs, the test suites of pandas
# and others included (35 CPU-s); COMPILE below compiles what runs, in parallel
$(TEST_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --no-compile -e '.[test,bench]'
	$(PYSPARK_ZIP_ASIDE)
	rm -f $(VENV)/.installed-*; touch $@ $(RUN_STAMP)

install-test: $(TEST_STAMP)

# `make run PORT=19610 METRICS_PORT=19611` runs a second broker beside one on the defaults; its
# data goes to ./data-19610 (a data directory belongs to one broker), unless DATA says where.
# CONTROLLER_PORT fixes the in-process controller's port (default: a free one).
PORT ?= 9092
METRICS_PORT ?= 9404
CONTROLLER_PORT ?=
DATA ?= ./data$(if $(filter-out 9092,$(PORT)),-$(PORT))
run: $(RUN_STAMP)
	$(PY) -m compileall -q -j 0 src >/dev/null
	$(VENV)/bin/oncelog serve --log-dirs $(DATA) --listeners PLAINTEXT://127.0.0.1:$(PORT) \
		--override metrics.port=$(METRICS_PORT)$(if $(CONTROLLER_PORT), --controller-listener 127.0.0.1:$(CONTROLLER_PORT))

lint: $(TEST_STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The suite in parallel (pytest-xdist; tests/conftest.py keeps a Spark session's tests and a
# module's shared servers on one worker). `make test` is the CI tier: every module, the fault
# matrices at their CI size, each fault type at least once; `make test-all` adds the `slow` tests
# and runs everything at full size (ONCELOG_TEST_TIER=all, tests/tiers.py). TEST_WORKERS=4 is the
# fastest of 3 and 4 on a 2-core machine once servers stopped compiling their sources (most
# tests wait on sockets and processes): `.ci/run` took 1,065-1,265 s with 4 (three runs), 1,258 s with 3;
# 1,047-1,154 s with 4 (five runs) once brokers were forked (testing/fork_server.py) and Spark's JVMs had a class archive;
# 696-868 s (six quiet runs) once the tests' commands were forked too and pip stopped byte-compiling;
# 620-752 s (seven fresh-clone runs, 2026-11-29).
TEST_WORKERS ?= 4
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadgroup
# Bytecode compiled once before the run: with PYTHONDONTWRITEBYTECODE set (as on CI's machines)
# every process would compile oncelog's sources again, about 1 s of CPU for each of the
# suite's hundreds of broker starts, CLI calls and Spark workers. A .pyc is read whatever
# that variable says. The installed packages are compiled here too (pip installs them without:
# above), their own test suites left out.
COMPILE := $(PY) -m compileall -q -j 0 src tests >/dev/null; \
	$(PY) -m compileall -q -j 0 -x '/tests?/' $(VENV)/lib/python*/site-packages >/dev/null; $(PYSPARK_ZIP_ASIDE)
# The Spark JVMs' class archive (tests/spark/class_archive.py, about 10 CPU-s less per JVM start)
# is built while lint runs; without it the tests still run, their JVMs start slower.
SPARK_CLASSES := build/spark-classes.jsa
$(SPARK_CLASSES): $(TEST_STAMP) tests/spark/class_archive.py
	@mkdir -p build
	@$(PY) tests/spark/class_archive.py $@ > build/spark-classes.log 2>&1 && tail -1 build/spark-classes.log || \
		echo "no Spark class archive (see build/spark-classes.log): the tests' JVMs start without it"
PREPARE := $(COMPILE); $(MAKE) --no-print-directory -j2 lint $(SPARK_CLASSES)
test: $(TEST_STAMP)
	$(PREPARE)
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) -m "not slow" --durations=25 --junitxml=build/pytest-ci.xml

test-all: $(TEST_STAMP)
	$(PREPARE)
	ONCELOG_TEST_TIER=all $(PY) -m pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) --durations=25

test-nightly: $(TEST_STAMP)
	$(PREPARE)
	ONCELOG_TEST_TIER=nightly $(PY) -m pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) --durations=25

# the tests that start no other process and no Spark session (tests/conftest.py marks the others)
.PHONY: test-fast
test-fast: $(TEST_STAMP)
	$(COMPILE)
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) -m "not processes and not spark and not slow" --durations=10

# librdkafka's own test suite against `oncelog serve` (compat/librdkafka/README.md): the first
# run fetches and builds librdkafka's test runner (about 3 min on 2 cores), later runs reuse it;
# the suite runs once as it is, then again its group entries with KIP-848 members (group.protocol=consumer, tests.consumer);
# fails if either run fails
compat: $(TEST_STAMP)
	$(PY) compat/librdkafka/run.py; classic=$$?; \
	$(PY) compat/librdkafka/run.py --group-protocol consumer; consumer=$$?; \
	test $$classic = 0 && test $$consumer = 0

# the CI-sized subsets (compat/librdkafka/tests.ci, and tests.consumer.ci with group.protocol=consumer),
# side by side after one build: each has its own broker and output directory, and their entries
# mostly wait on the suite's timeouts, so together they take about as long as the longer one
compat-ci: $(TEST_STAMP)
	bash compat/librdkafka/build.sh >/dev/null
	mkdir -p build
	$(PY) compat/librdkafka/run.py --group-protocol consumer --subset ci > build/compat-ci-consumer.out 2>&1 & \
	consumer_pid=$$!; \
	$(PY) compat/librdkafka/run.py --subset ci; classic=$$?; \
	wait $$consumer_pid; consumer=$$?; \
	echo "--- group.protocol=consumer:"; cat build/compat-ci-consumer.out; \
	test $$classic = 0 && test $$consumer = 0

clean:
	rm -rf $(VENV) data data-*
