"""Storage faults against a real `oncelog serve` process, injected by ONCELOG_FAILPOINTS after the
bytes reached the segment: what producers are told and what consumers see (issue 13 item 1)."""
from __future__ import annotations

import pytest
from test_dedup_raw import Client, Conn, batch  # noqa: E402  (tests/broker is on sys.path)

from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.workloads import read_range

pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]


async def _client(b: BrokerProcess) -> Client:
    return Client(await Conn.open(b.host, b.port))


def _values(bootstrap: str, topic: str) -> list[tuple[int, bytes]]:
    return read_range(bootstrap, topic, timeout_s=30)[0][0]


async def test_failed_fsync_answers_storage_error_and_the_retry_lands_once(tmp_path):
    topic = "fsync-eio"
    # fsyncs of the partition: its new segment, seq 0..2 (flush.messages=1), then seq 3..5 fails
    b = BrokerProcess(tmp_path / "data", env={"ONCELOG_FAILPOINTS": f"fsync-eio:log:match={topic}-0:after=2"})
    b.start()
    try:
        c = await _client(b)
        await c.create_topic(topic, **{"flush.messages": "1"})
        p, _ = await c.produce(topic, batch(0, 3))
        assert (p["error_code"], p["base_offset"]) == (0, 0)
        p, _ = await c.produce(topic, batch(3, 3))
        assert p["error_code"] == E.KAFKA_STORAGE_ERROR, p
        assert [o for o, _ in _values(b.bootstrap, topic)] == [0, 1, 2]   # nothing of the failed batch
        p, _ = await c.produce(topic, batch(3, 3))                          # the retry
        assert (p["error_code"], p["base_offset"]) == (0, 3), p
        p, _ = await c.produce(topic, batch(3, 3))                          # and its duplicate
        assert (p["error_code"], p["base_offset"]) == (0, 3), p
        got = _values(b.bootstrap, topic)
        assert [o for o, _ in got] == [0, 1, 2, 3, 4, 5]
        assert len({v for _, v in got}) == 6
        await c.conn.close()
        b.kill()                                                            # and after a crash
        b.env = {}
        b.start()
        assert [o for o, _ in _values(b.bootstrap, topic)] == [0, 1, 2, 3, 4, 5]
    finally:
        b.stop()


async def test_a_cut_that_fails_takes_the_partition_offline_until_restart(tmp_path):
    topic = "cut-fails"
    b = BrokerProcess(tmp_path / "data", env={"ONCELOG_FAILPOINTS":
                                              f"fsync-eio:log:match={topic}-0:after=2,truncate-eio:log"})
    b.start()
    try:
        c = await _client(b)
        await c.create_topic(topic, **{"flush.messages": "1"})
        await c.create_topic("healthy")
        assert (await c.produce(topic, batch(0, 3)))[0]["error_code"] == 0
        assert (await c.produce(topic, batch(3, 3)))[0]["error_code"] == E.KAFKA_STORAGE_ERROR
        p, _ = await c.produce(topic, batch(3, 3))
        assert p["error_code"] == E.KAFKA_STORAGE_ERROR and "offline" in (p["error_message"] or ""), p
        assert (await c.produce("healthy", batch(0, 3, pid=9)))[0]["error_code"] == 0  # only that partition
        await c.conn.close()
        b.kill()
        b.env = {}
        b.start()                                                  # recovery: online again
        c = await _client(b)
        c.topic_ids[topic] = await _topic_id(c, topic)
        p, _ = await c.produce(topic, batch(3, 3))
        # the bytes the cut could not remove were whole: recovery kept them and knows the batch
        assert (p["error_code"], p["base_offset"]) == (0, 3), p
        assert [o for o, _ in _values(b.bootstrap, topic)] == [0, 1, 2, 3, 4, 5]
        await c.conn.close()
    finally:
        b.stop()


async def _topic_id(c: Client, name: str):
    from oncelog.protocol import metadata as metadata_codec
    body = await c.conn.raw(3, 12, metadata_codec.encode_request(12, [name]), True)
    return metadata_codec.decode_response(12, body).topics[name].topic_id
