"""Issue 13, item 5: a topic config that passes validation can always be applied, and a stored one
that no longer validates never stops a start. Real broker processes, real registry files."""
from __future__ import annotations

import json

import pytest

from oncelog.client import AdminClient, Producer
from oncelog.client.aio.admin import AdminError
from oncelog.protocol.errors import ErrorCode
from oncelog.storage.log_manager import REGISTRY
from oncelog.testing.embedded import BrokerProcess

BAD = {
    "producer.state.duplicate.lookup.offsets": "2147483648",  # the value: saved, then no start
    "producer.state.expired.lookup.offsets": str(2**30),
    "producer.state.max.producers.per.partition": "0",
    "producer.state.batches.to.retain": "1001",
    "max.in.flight.sequence.number.per.connection": str(2**30 + 1),
    "segment.bytes": str(2**31),  # an int config beyond INT32
    "retention.ms": str(2**63),   # a long beyond INT64
}
EDGE = {
    "producer.state.duplicate.lookup.offsets": str(2**30 - 1),
    "producer.state.max.producers.per.partition": "1",
    "segment.bytes": str(2**31 - 1),
}


def _code(exc: AdminError) -> ErrorCode:
    return exc.code


def test_out_of_range_values_are_refused_at_create_and_alter(broker):
    with AdminClient({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.create_topics(["bounded"])["bounded"].result()
        for name, value in BAD.items():
            with pytest.raises(AdminError) as created:
                admin.create_topics([f"bad-{name}"], config={name: value})[f"bad-{name}"].result()
            assert _code(created.value) == ErrorCode.INVALID_CONFIG, (name, created.value)
            with pytest.raises(AdminError) as altered:
                admin.alter_configs("bounded", {name: value})
            assert _code(altered.value) == ErrorCode.INVALID_CONFIG, (name, altered.value)
        admin.create_topics(["edge"], config=EDGE)["edge"].result()  # the bounds themselves are accepted
        assert admin.describe_configs("edge", list(EDGE)) == EDGE
        assert "bad-producer.state.duplicate.lookup.offsets" not in admin.list_topics()
    broker.restart()  # and nothing that was accepted stops a start
    with AdminClient({"bootstrap.servers": broker.bootstrap}) as admin:
        assert admin.describe_configs("edge", list(EDGE)) == EDGE


def _produce_idempotently(bootstrap: str, topic: str, n: int = 20) -> list[int]:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": "required"})
    try:
        futures = [p.send(topic, value=b"v%d" % i, partition=0) for i in range(n)]
        return [f.result(30).offset for f in futures]
    finally:
        p.close()


@pytest.mark.processes
def test_a_stored_config_that_no_longer_validates_does_not_stop_a_start(tmp_path):
    b = BrokerProcess(tmp_path / "data").start()
    try:
        with AdminClient({"bootstrap.servers": b.bootstrap}) as admin:
            admin.create_topics(["kept"], config={"producer.state.batches.to.retain": "8",
                                                  "producer.state.duplicate.lookup.offsets": "100"})["kept"].result()
        assert _produce_idempotently(b.bootstrap, "kept") == list(range(20))
    finally:
        b.stop()
    registry = tmp_path / "data" / REGISTRY
    topics = json.loads(registry.read_text())
    topics[0]["overrides"]["producer.state.duplicate.lookup.offsets"] = "2147483648"  # as main saved it
    topics[0]["overrides"]["no.such.config"] = "1"
    registry.write_text(json.dumps(topics))

    b.start()
    try:
        log = b.log_tail(20000)
        assert "stored config producer.state.duplicate.lookup.offsets='2147483648'" in log
        assert "no.such.config" in log
        with AdminClient({"bootstrap.servers": b.bootstrap}) as admin:
            cfg = admin.describe_configs("kept", ["producer.state.duplicate.lookup.offsets",
                                                  "producer.state.batches.to.retain"])
        # the bad value falls back to the default; the good override next to it still applies
        assert cfg == {"producer.state.duplicate.lookup.offsets": "0", "producer.state.batches.to.retain": "8"}
        assert _produce_idempotently(b.bootstrap, "kept") == list(range(20, 40))
    finally:
        b.stop()


def test_broker_wide_timestamp_type_is_accepted():
    """`log.message.timestamp.type=LogAppendTime` used to be refused at start: its choices were
    matched case-insensitively under the broker-wide name, against mixed-case values."""
    from oncelog.broker.config import BrokerConfig
    from oncelog.core.topic_config import TOPIC_CONFIGS, ConfigError
    for value in ("CreateTime", "LogAppendTime"):
        assert BrokerConfig({"log.message.timestamp.type": value})["log.message.timestamp.type"] == value
    assert TOPIC_CONFIGS["producer.state.dedup.mode"].parse("RANGE") == "range"  # lower-case choices: any case
    with pytest.raises(ConfigError):
        TOPIC_CONFIGS["message.timestamp.type"].parse("createtime")  # Kafka's check is exact here
