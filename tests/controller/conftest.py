"""A controller and brokers as real processes for the cluster tests."""
import pytest

from oncelog.testing.embedded import BrokerProcess, ControllerProcess, broker_overrides


@pytest.fixture
def cluster(tmp_path):
    """start(n) -> (controller, [brokers]); everything is stopped after the test."""
    started = []

    def start(n=3):
        c = ControllerProcess(tmp_path / "metadata").start()
        started.append(c)
        brokers = []
        for i in range(1, n + 1):
            b = BrokerProcess(tmp_path / f"broker{i}", broker_overrides(c, i)).start()
            started.append(b)
            brokers.append(b)
        return c, brokers

    yield start
    for x in reversed(started):
        x.stop()
