"""Log compaction against a real broker: compacted topics refuse keyless records, cleanup.policy
is a list config (IncrementalAlterConfigs APPEND / SUBTRACT), the cleaner thread compacts a
topic while it is served, a kill -9 in the middle of a segment swap loses no latest value, and
an idempotent producer's retry of its last batch is still a duplicate after its records were
cleaned away and the broker restarted without producer-state snapshots."""
from __future__ import annotations

import time

import pytest
from kio.schema.incremental_alter_configs.v1 import request as iac_req
from kio.schema.incremental_alter_configs.v1.response import IncrementalAlterConfigsResponse
from kio.static.primitive import i8
from test_dedup_raw import Client, Conn, broker, parse_produce, produce_body  # noqa: F401 - broker: fixture

from oncelog.protocol import produce as produce_wire
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.records import Record, encode_batch
from oncelog.storage import producer_snapshots as snaps
from oncelog.storage.cleaner import CHECKPOINT
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.workloads import read_range

pytestmark = [pytest.mark.timeout(240)]

NOW = 1_700_000_000_000
APPEND, SUBTRACT = 2, 3
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": "1024", "min.cleanable.dirty.ratio": "0.01",
             "retention.ms": "-1"}  # the records are stamped in 2023


def keyed(key: bytes, value: bytes | None, pid: int = -1, seq: int = -1) -> bytes:
    return encode_batch([Record(0, NOW, key, value, [])], producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                        base_sequence=seq)


async def alter_op(c: Client, topic: str, name: str, value: str, op: int) -> tuple[int, str | None]:
    req = iac_req.IncrementalAlterConfigsRequest(resources=(iac_req.AlterConfigsResource(
        resource_type=i8(2), resource_name=topic,
        configs=(iac_req.AlterableConfig(name=name, config_operation=i8(op), value=value),)),),
        validate_only=False)
    resp = await c.conn.kio(req, IncrementalAlterConfigsResponse)
    return resp.responses[0].error_code.value, resp.responses[0].error_message


@pytest.mark.processes
async def test_cleanup_policy_append_subtract_and_keyless_records(broker):  # noqa: F811 - the fixture
    c, b, _tmp = broker
    await c.create_topic("plain")
    p, _ = await c.produce("plain", encode_batch([Record(0, NOW, None, b"no key", [])]))
    assert p["error_code"] == 0
    assert await alter_op(c, "plain", "cleanup.policy", "compact", APPEND) == (0, None)
    assert b.logs.topics["plain"].overrides["cleanup.policy"] == "delete,compact"
    p, _ = await c.produce("plain", encode_batch([Record(0, NOW, None, b"no key", [])]))
    assert p["error_code"] == E.INVALID_RECORD, p
    p, _ = await c.produce("plain", keyed(b"k", b"v"))
    assert p["error_code"] == 0, p
    # the answer names each keyless record of the batch (KIP-467's RecordErrors)
    mixed = encode_batch([Record(i, NOW, None if i in (1, 3) else b"k", b"v", []) for i in range(4)])
    body = await c.conn.raw(0, 9, produce_body(9, "plain", 0, mixed), True)
    answer = produce_wire.decode_response(9, body)[0].partitions[0]
    assert answer.error_code == E.INVALID_RECORD
    assert [i for i, _msg in answer.record_errors] == [1, 3]
    assert await alter_op(c, "plain", "cleanup.policy", "delete", SUBTRACT) == (0, None)
    assert b.logs.topics["plain"].overrides["cleanup.policy"] == "compact"
    code, _msg = await alter_op(c, "plain", "cleanup.policy", "compact", SUBTRACT)
    assert code == E.INVALID_CONFIG  # nothing left
    code, _msg = await alter_op(c, "plain", "retention.ms", "5", APPEND)
    assert code == E.INVALID_CONFIG  # not a list config
    code, _msg = await alter_op(c, "plain", "cleanup.policy", "shred", APPEND)
    assert code == E.INVALID_CONFIG


def _wait(predicate, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


async def _fill(c: Client, topic: str, keys: int, rounds: int) -> tuple[dict[bytes, bytes], bytes, int]:
    """Producer 7 writes each key once (idempotent), then plain producers overwrite every key
    `rounds` times: producer 7's batches are all superseded. Returns the latest value per key,
    producer 7's last batch and its offset."""
    latest = {}
    last = b""
    last_offset = -1
    for k in range(keys):
        key = b"k%d" % k
        last = keyed(key, b"%s=pid7" % key, pid=7, seq=k)
        p, _ = await c.produce(topic, last)
        assert p["error_code"] == 0, p
        last_offset = p["base_offset"]
        latest[key] = b"%s=pid7" % key
    for r in range(rounds):
        for k in range(keys):
            key = b"k%d" % k
            value = None if (r == rounds - 1 and k == 0) else b"%s=r%d" % (key, r)
            p, _ = await c.produce(topic, keyed(key, value))
            assert p["error_code"] == 0, p
            latest[key] = value
    return latest, last, last_offset


def _check_latest(bootstrap: str, topic: str, latest: dict[bytes, bytes | None], produced: int) -> int:
    records = read_range(bootstrap, topic, timeout_s=60)[0][0]
    offsets = [o for o, _v in records]
    assert offsets == sorted(set(offsets))
    last: dict[bytes, bytes] = {}
    for _o, v in records:
        if v is not None:
            last[v.split(b"=")[0]] = v
    for key, value in latest.items():
        if value is not None:
            assert last.get(key) == value, (key, last.get(key), value)
    return len(records)


@pytest.mark.processes
@pytest.mark.parametrize("where", [".log.cleaned", ".log.swap"])
async def test_kill_9_during_a_segment_swap_loses_no_latest_value(tmp_path, where):
    """The broker dies right before renaming the cleaned segment to `.swap` (before the commit
    point) or the `.swap` to its final name (after it). At the restart recovery discards or
    finishes the swap; every key's latest value is there, the cleaner finishes its work, and
    producer 7's last batch (emptied by the cleaner) still answers its retry as a duplicate
    after a restart that rebuilds producer state from the log alone."""
    topic = "compacted"
    overrides = {"log.retention.check.interval.ms": "100"}
    b = BrokerProcess(tmp_path / "data", overrides,
                      env={"ONCELOG_FAILPOINTS": f"crash:log:match={where}:at=rename"}).start()
    directory = tmp_path / "data" / f"{topic}-0"
    try:
        c = Client(await Conn.open(b.host, b.port))
        # filled first, compacted after: the failpoint fires only once everything is answered
        await c.create_topic(topic, **{**COMPACTED, "cleanup.policy": "delete"})
        latest, last_batch, last_offset = await _fill(c, topic, keys=10, rounds=6)
        produced = 10 * 7
        assert await alter_op(c, topic, "cleanup.policy", "compact", APPEND) == (0, None)
        assert b.proc.wait(60) == -9  # the cleaner's first swap hit the failpoint
        b.env = {}
        b.start()
        _wait(lambda: (directory / CHECKPOINT).exists(), "a cleaner pass after the restart")
        kept = _check_latest(b.bootstrap, topic, latest, produced)
        assert kept < produced
        b.stop()
        snaps.delete_snapshots(p for _off, p in snaps.list_snapshots(directory))
        b.start()
        c = Client(await Conn.open(b.host, b.port))
        c.topic_ids[topic] = None
        body = await c.conn.raw(0, 9, produce_body(9, topic, 0, last_batch), True)
        p = parse_produce(9, body)[0]
        assert (p["error_code"], p["base_offset"]) == (0, last_offset), p
        body = await c.conn.raw(0, 9, produce_body(9, topic, 0, keyed(b"k1", b"k1=next", pid=7, seq=10)), True)
        p = parse_produce(9, body)[0]
        assert p["error_code"] == 0, p
        await c.conn.close()
    finally:
        b.stop()
