"""Brokers for integration tests: real `oncelog serve` processes on loopback, real files; and
librdkafka's mock cluster (in this process, through ctypes) for the client's error paths.

What a test starts decides where it runs: `make test-fast` runs the tests that start no other
process and no Spark session (`pytest -m "not processes and not spark and not slow"`), `make test`
runs everything. A test is marked `processes` by the fixtures it uses (those that start a broker,
a controller or Tansu: `_PROCESS_FIXTURES`) or by its own mark, `spark` by the Spark session
fixtures; a test that starts a server without the mark fails, so the fast run stays what it says."""
import itertools
import sys

import pytest

from oncelog.testing.embedded import BrokerProcess, ServerProcess
from oncelog.testing.handler_bugs import no_handler_bugs  # noqa: F401  (autouse: a handler bug a broker logs fails the test)

_topic_counter = itertools.count()

# fixtures that start processes, wherever they are defined (a test module that defines its own
# fixture of the same name, in-process, is not marked by it)
_PROCESS_FIXTURES = frozenset({"broker", "shared_broker", "oncelog_broker", "tansu", "cluster"})
_SPARK_FIXTURES = frozenset({"_spark_sessions"})


def pytest_collection_modifyitems(items):
    if "oncelog.cli" in sys.modules:  # the composition root: nothing imports it, tests neither
        raise pytest.UsageError("a test imports oncelog.cli: run the command as a user does "
                                "(a subprocess, as tests/cli does) or use oncelog.testing")
    for item in items:
        own = vars(item.module) if getattr(item, "module", None) else {}
        used = {name for name in item.fixturenames if name not in own}
        if used & _PROCESS_FIXTURES:
            item.add_marker(pytest.mark.processes)
        if set(item.fixturenames) & _SPARK_FIXTURES:
            item.add_marker(pytest.mark.spark)


@pytest.fixture(autouse=True)
def _servers_only_when_marked(request, monkeypatch):
    """A test not marked `processes` that starts a server fails: it would slow `make test-fast`."""
    if request.node.get_closest_marker("processes") is None:
        def refuse(self, *args, **kwargs):
            raise RuntimeError(f"{request.node.nodeid} starts {type(self).__name__} but is not marked "
                               "`processes`: add @pytest.mark.processes (tests/conftest.py says why)")
        monkeypatch.setattr(ServerProcess, "start", refuse)


@pytest.fixture
def broker(tmp_path):
    """A fresh broker for one test (data in tmp_path/data)."""
    b = BrokerProcess(tmp_path / "data").start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def shared_broker(tmp_path_factory):
    """One broker for the session; tests make their own topics with `unique_topic`."""
    b = BrokerProcess(tmp_path_factory.mktemp("shared") / "data").start()
    yield b
    b.stop()


@pytest.fixture
def unique_topic(request):
    name = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")[:180]
    return f"{name}-{next(_topic_counter)}"


def _mock_cluster(brokers: int):
    from oncelog.testing.rdkafka_mock import MockCluster
    mc = MockCluster(brokers)
    try:
        yield mc
    finally:
        mc.close()


@pytest.fixture
def rdkafka_mock():
    yield from _mock_cluster(1)


@pytest.fixture
def rdkafka_mock3():
    yield from _mock_cluster(3)
