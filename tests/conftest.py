"""Brokers for integration tests: real `oncelog serve` processes on loopback, real files."""
import itertools

import pytest

from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.handler_bugs import no_handler_bugs  # noqa: F401  (autouse: a handler bug a broker logs fails the test)

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
