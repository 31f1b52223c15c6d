"""Brokers for integration tests: real `oncelog serve` processes on loopback, real files; and
librdkafka's mock cluster (in this process, through ctypes) for the client's error paths."""
import itertools

import pytest

from oncelog.testing.embedded import BrokerProcess

_topic_counter = itertools.count()


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
