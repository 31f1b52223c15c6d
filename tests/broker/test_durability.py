"""Durable acknowledgements against a real broker process: an acks=all answer means fsynced (the
failpoint ledger says what each fsync covered), an emulated power cut keeps every acknowledged
record, write.caching=true keeps page-cache answers, and a failed group-commit fsync is answered
KAFKA_STORAGE_ERROR with nothing of it left for consumers."""
from __future__ import annotations

import os
import time

import pytest
from test_dedup_raw import Client, Conn, batch, parse_produce, produce_body  # noqa: E402

from oncelog.protocol.errors import ErrorCode as E
from oncelog.storage.failpoints import read_ledger
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.power_loss import LEDGER, lose_unsynced, with_ledger
from oncelog.testing.workloads import read_range

pytestmark = [pytest.mark.timeout(180), pytest.mark.processes]


async def _client(b: BrokerProcess) -> Client:
    return Client(await Conn.open(b.host, b.port))


def _offsets(bootstrap: str, topic: str) -> list[int]:
    return [o for o, _v in read_range(bootstrap, topic, timeout_s=30)[0].get(0, [])]


async def _produce(c: Client, topic: str, records: bytes, acks: int) -> dict:
    body = await c.conn.raw(0, 9, produce_body(9, topic, 0, records, acks=acks), True)
    return parse_produce(9, body)[0]


async def test_an_acks_all_answer_means_its_batch_was_fsynced(tmp_path):
    b = BrokerProcess(tmp_path / "data", env={"ONCELOG_FAILPOINTS": LEDGER}).start()
    try:
        c = await _client(b)
        await c.create_topic("d")
        segment = tmp_path / "data" / "d-0" / "00000000000000000000.log"
        for i in range(20):
            p = await _produce(c, "d", batch(2 * i, 2), acks=-1)
            assert (p["error_code"], p["base_offset"]) == (0, 2 * i)
            # nothing else writes to it: everything in the file was covered by an fsync
            assert read_ledger(segment.parent)[segment.name] >= os.path.getsize(segment)
        await c.conn.close()
    finally:
        b.stop()


async def test_power_loss_keeps_every_acknowledged_record_unless_write_caching(tmp_path):
    b = BrokerProcess(tmp_path / "data", env={"ONCELOG_FAILPOINTS": LEDGER}).start()
    try:
        c = await _client(b)
        await c.create_topic("durable")
        await c.create_topic("cached", **{"write.caching": "true"})
        await c.create_topic("acks1")
        acked = {"durable": 0, "cached": 0, "acks1": 0}
        for i in range(30):
            for topic, acks in (("durable", -1), ("cached", -1), ("acks1", 1)):
                p = await _produce(c, topic, batch(2 * i, 2, pid=7), acks=acks)
                assert p["error_code"] == 0, p
                acked[topic] = p["base_offset"] + 2
        await c.conn.close()
        b.kill()
        cuts = {cut.path.parent.name: cut for cut in lose_unsynced(tmp_path / "data")}
        b.env = {"ONCELOG_FAILPOINTS": LEDGER}
        b.start()
        assert _offsets(b.bootstrap, "durable") == list(range(acked["durable"]))
        # page-cache answers are what a power cut takes: write.caching=true chose them
        assert "cached-0" in cuts and len(_offsets(b.bootstrap, "cached")) < acked["cached"]
        assert "durable-0" not in cuts
    finally:
        b.stop()


async def test_a_failed_group_commit_fsync_is_a_storage_error_and_leaves_nothing(tmp_path):
    topic = "gc"
    # fsyncs of gc-0: the new segment, the group commit of the first batch, then the second fails
    b = BrokerProcess(tmp_path / "data", env={"ONCELOG_FAILPOINTS": f"fsync-eio:log:match={topic}-0:after=2"})
    b.start()
    try:
        c = await _client(b)
        await c.create_topic(topic)
        p, _ = await c.produce(topic, batch(0, 3))
        assert (p["error_code"], p["base_offset"]) == (0, 0)
        p, _ = await c.produce(topic, batch(3, 3))
        assert p["error_code"] == E.KAFKA_STORAGE_ERROR, p
        assert _offsets(b.bootstrap, topic) == [0, 1, 2]
        p, _ = await c.produce(topic, batch(3, 3))
        assert (p["error_code"], p["base_offset"]) == (0, 3), p
        p, _ = await c.produce(topic, batch(3, 3))
        assert (p["error_code"], p["base_offset"]) == (0, 3), p
        assert _offsets(b.bootstrap, topic) == [0, 1, 2, 3, 4, 5]
        await c.conn.close()
    finally:
        b.stop()


async def test_a_crash_between_write_and_fsync_then_power_loss_keeps_what_was_answered(tmp_path):
    """The broker dies (SIGKILL at the failpoint) right after writing the 11th batch, before its
    fsync; the power cut then takes what no fsync covered. Every answered batch is there, the
    unanswered one may or may not be, and its retry is never stored twice."""
    topic = "crash"
    spec = with_ledger(f"crash:log:match={topic}-0:after=10")
    b = BrokerProcess(tmp_path / "data", env={"ONCELOG_FAILPOINTS": spec}).start()
    try:
        c = await _client(b)
        await c.create_topic(topic)
        answered = 0
        with pytest.raises((EOFError, OSError)):  # the broker died mid-request
            for i in range(20):
                p, _ = await c.produce(topic, batch(2 * i, 2))
                assert p["error_code"] == 0
                answered = p["base_offset"] + 2
        assert answered == 20 and b.proc.wait(10) == -9
        lose_unsynced(tmp_path / "data")
        b.env = {"ONCELOG_FAILPOINTS": LEDGER}
        b.start()
        c = await _client(b)
        c.topic_ids[topic] = None
        for _retry in range(2):
            body = await c.conn.raw(0, 9, produce_body(9, topic, 0, batch(20, 2)), True)
            p = parse_produce(9, body)[0]
            assert (p["error_code"], p["base_offset"]) == (0, 20), p
        assert _offsets(b.bootstrap, topic) == list(range(22))
        await c.conn.close()
    finally:
        b.stop()


def test_write_caching_default_is_the_server_wide_default():
    from oncelog.broker.config import BrokerConfig
    from oncelog.core.topic_config import effective_topic_config
    assert effective_topic_config(BrokerConfig().topic_defaults(), {})["write.caching"] is False
    on = BrokerConfig({"write.caching.default": "true"}).topic_defaults()
    assert effective_topic_config(on, {})["write.caching"] is True
    assert effective_topic_config(on, {"write.caching": "false"})["write.caching"] is False


async def test_switching_write_caching_off_at_runtime_syncs_what_consumers_wait_for(tmp_path):
    b = BrokerProcess(tmp_path / "data", {"log.retention.check.interval.ms": "200"}).start()
    try:
        c = await _client(b)
        await c.create_topic("switch", **{"write.caching": "true"})
        for i in range(3):
            assert (await c.produce("switch", batch(2 * i, 2)))[0]["error_code"] == 0
        await c.alter("switch", write_caching="false")
        # nothing new is appended: the periodic task fsyncs, and the records are readable again
        deadline = time.monotonic() + 15
        while _offsets(b.bootstrap, "switch") != list(range(6)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _offsets(b.bootstrap, "switch") == list(range(6))
        await c.conn.close()
    finally:
        b.stop()
