"""Issue 13, item 5 in cluster mode: a topic config held by the controller's metadata log that no
longer validates (written before the bounds existed) must neither stop a broker from leading the
partition nor make its follower loop fail on every poll. Real controller and broker processes."""
from __future__ import annotations

import pytest

from oncelog.client import AdminClient, Producer
from oncelog.core.leadership import TOPIC_CONFIG
from oncelog.storage.metadata_log import MetadataLog
from oncelog.testing.embedded import BrokerProcess, ControllerProcess, broker_overrides

pytestmark = pytest.mark.processes


def _produce(bootstrap: str, topic: str, n: int = 10) -> list[int]:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": "required",
                  "delivery.timeout.ms": 30000, "request.timeout.ms": 10000})
    try:
        futures = [p.send(topic, value=b"v%d" % i, partition=0) for i in range(n)]
        return [f.result(60).offset for f in futures]
    finally:
        p.close()


def test_a_bad_config_in_the_metadata_log_does_not_stop_a_broker(tmp_path):
    c = ControllerProcess(tmp_path / "meta", log_file=tmp_path / "controller.log").start()
    b = BrokerProcess(tmp_path / "data", {**broker_overrides(c, 1), "oncelog.cluster": "true"},
                      log_file=tmp_path / "broker1.log")
    try:
        b.start()
        with AdminClient({"bootstrap.servers": b.bootstrap}) as admin:
            admin.create_topics(["t"], config={"producer.state.batches.to.retain": "8"})["t"].result()
        assert _produce(b.bootstrap, "t") == list(range(10))
        b.stop()
        c.stop()
        meta = MetadataLog(tmp_path / "meta")
        meta.append([{"type": TOPIC_CONFIG, "name": "t", "overrides": {
            "producer.state.batches.to.retain": "8", "producer.state.duplicate.lookup.offsets": "2147483648"}}])
        meta.close()
        c.start()
        b.start()  # must open the partition it leads, with the default for the bad value
        assert _produce(b.bootstrap, "t") == list(range(10, 20))
        with AdminClient({"bootstrap.servers": b.bootstrap}) as admin:
            assert admin.describe_configs("t", ["producer.state.duplicate.lookup.offsets",
                                                "producer.state.batches.to.retain"]) == {
                "producer.state.duplicate.lookup.offsets": "0", "producer.state.batches.to.retain": "8"}
        log = b.log_tail(50000)
        assert "stored config producer.state.duplicate.lookup.offsets='2147483648'" in log
        assert "following the controller's view failed" not in log
    finally:
        b.stop()
        c.stop()
