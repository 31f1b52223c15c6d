"""Put first on PYTHONPATH for the processes tests start (tests/conftest.py): oncelog servers and
commands never use hypothesis, and kio registers its strategies, a third of a start's imports, when
it can import it. The test processes themselves import the real one."""
raise ImportError("hypothesis is hidden from the processes tests start (tests/conftest.py)")
