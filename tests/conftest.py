"""Brokers for integration tests: real `oncelog serve` processes on loopback, real files; and
librdkafka's mock cluster (in this process, through ctypes) for the client's error paths.

What a test starts decides where it runs: `make test-fast` runs the tests that start no other
process and no Spark session (`pytest -m "not processes and not spark and not slow"`), `make test`
runs everything but the `slow` tier, in parallel (pytest-xdist), and `make test-all` everything at
its full size (`ONCELOG_TEST_TIER=all`, read by tests/tiers.py). A test is
marked `processes` by the fixtures it uses (those that start a broker, a controller or Tansu:
`_PROCESS_FIXTURES`) or by its own mark, `spark` by the Spark session fixtures; a test that starts a
server without the mark fails, so the fast run stays what it says.

Under xdist (`--dist loadgroup`) the tests that share a Spark session run on one worker (one
SparkContext per process) and those that start Spark drivers of their own on another (a JVM
starved of CPU by two others takes three times as long), and the tests of a module whose servers
are module-scoped run together, so each such server starts once."""
import itertools
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings
from tests.tiers import TIER

from oncelog.testing.embedded import BrokerProcess, ServerProcess
from oncelog.testing.handler_bugs import no_handler_bugs  # noqa: F401  (autouse: a handler bug a broker logs fails the test)

_topic_counter = itertools.count()

# fixtures that start processes, wherever they are defined (a test module that defines its own
# fixture of the same name, in-process, is not marked by it)
_PROCESS_FIXTURES = frozenset({"broker", "shared_broker", "oncelog_broker", "tansu", "cluster"})
_SPARK_FIXTURES = frozenset({"_spark_sessions"})
_LONGEST_GROUPS = {"spark-drivers": 0, "spark-session": 1}   # scheduled first, longest first


# Hypothesis: a test's explicit max_examples is its full size; in the CI tier it runs a third of
# them (tests/tiers.py `examples`). Either profile prints the blob that reproduces a failure.
if TIER not in ("ci", "all", "nightly"):
    raise pytest.UsageError(f"ONCELOG_TEST_TIER={TIER!r}: ci, all or nightly")
settings.register_profile("ci", print_blob=True)
settings.register_profile("all", print_blob=True)
settings.register_profile("nightly", print_blob=True, deadline=None)
settings.load_profile(TIER)

# Brokers and controllers are forked from a process that imported what they import once
# (oncelog.testing.fork_server): 0.1 CPU-s a start instead of 0.8, over about 400 starts.
# ONCELOG_TEST_FORK_SERVER=0 starts each with exec.
os.environ.setdefault("ONCELOG_TEST_FORK_SERVER", "1")

# The tests' Spark JVMs (their own session's and the drivers they start) run for seconds each:
# the C1 compiler alone and the serial collector spend less of the two cores on compiling and
# collecting than the server defaults tuned for long jobs. A user's setting wins.
# They also start from the class archive the Makefile builds beside lint (tests/spark/class_archive.py:
# Spark's classes parsed and verified once, about 10 CPU-s less per JVM start), when it is there.
_CLASS_ARCHIVE = Path(__file__).parent.parent / "build" / "spark-classes.jsa"
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC" + (
    f" -XX:SharedArchiveFile={_CLASS_ARCHIVE} -Xlog:cds=off,cds+dynamic=off" if _CLASS_ARCHIVE.exists() else ""))


def _xdist_group(item) -> str | None:
    """Tests that must share a worker: a Spark session's, and a module's that share a server (a
    module may name its own group: the fault matrices share "faults", so that no two run at once
    and each keeps the CPU its fault schedule and time budget assume)."""
    if item.get_closest_marker("xdist_group") is not None:
        return None
    if item.get_closest_marker("spark"):
        # a JVM needs a core: the tests in this process's Spark session on one worker, those
        # that start Spark drivers of their own on another, so that at most two JVMs run at once
        return "spark-session" if set(item.fixturenames) & _SPARK_FIXTURES else "spark-drivers"
    if item.get_closest_marker("processes") is None:
        return None
    for name in item.fixturenames:
        defs = item._fixtureinfo.name2fixturedefs.get(name)
        if defs and defs[-1].scope in ("module", "class", "package"):
            return item.nodeid.split("::")[0]
    return None


@pytest.hookimpl(tryfirst=True)   # before xdist's, which reads the xdist_group marks set here
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
        group = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    # xdist hands out work in collection order, a group when its first test comes up: the
    # longest chains (the Spark drivers', about 12 minutes of one worker, then the Spark
    # session's) start first, or they start when most of the suite has run and are then the
    # run's critical path. And one SparkContext per process, where asking for the other master
    # restarts it (about 20 s): the tests on local[2,3] run after all those on local[2], so the
    # worker starts each once.
    def rank(item) -> int:
        mark = item.get_closest_marker("xdist_group")
        return _LONGEST_GROUPS.get(mark.args[0], 2) if mark is not None else 2
    items.sort(key=lambda item: (rank(item), "spark_retry" in item.fixturenames))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """Under `--dist loadgroup` each xdist worker must see the group in the node ids (xdist
    passes groups to its scheduler that way). pytest 9.2 ignores xdist's rewrite (pytest-xdist
    #1386), and the groups are then silently dropped: Spark JVMs on every worker, the fault
    matrices side by side. Refuse to run rather than run that way."""
    config = session.config
    if not getattr(config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid]
    if lost:
        sys.stderr.write(f"--dist loadgroup is not grouping: pytest {pytest.__version__} (pytest-xdist #1386)\n")
        raise pytest.UsageError(f"--dist loadgroup is not grouping ({len(lost)} tests, e.g. {lost[0]}): "
                                f"pytest {pytest.__version__} and this pytest-xdist do not work together "
                                "(pytest-xdist #1386); install the pytest that pyproject.toml pins")


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
    # KIP-939 enabled (Kafka's default is off): the Spark sink's exactly-once uses two-phase
    # commit wherever the broker allows it, and that is the path its tests should exercise
    b = BrokerProcess(tmp_path_factory.mktemp("shared") / "data",
                      {"transaction.two.phase.commit.enable": "true"}).start()
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
