"""Dead-letter records (KIP-1191) across a broker killed -9 around their write, against a real broker
process: the storage failpoints kill it right after (or right before) a write or an fsync of the
group's state log or of the dead-letter partition, optionally with a power cut that keeps only
what was fsynced, then it starts again on the same data. Whatever the moment, every rejected
record ends with exactly one dead-letter record and ARCHIVED, where Kafka allows "more than one
DLQ record ... in rare situations".

The writes, in order, after the member's REJECT: (1) the state write that makes the records
ARCHIVING with their dead letters (the acknowledgement waits for it), (2) the state write of the
share-partition's dead-letter producer (its id and epoch, before it writes anything), (3) the
dead-letter batch in `dlq.g-0` and its fsync, (4) the state write that marks them ARCHIVED."""
from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from test_dedup_raw import Client, Conn, batch, produce_body
from test_share_group_protocol import ACCEPT, REJECT, Sharer, call

from oncelog.client.aio.consumer import AIOConsumer
from oncelog.client.types import TopicPartition
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.storage.share_state import LOG_NAME, GroupStateLog
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.power_loss import LEDGER, lose_unsynced, with_ledger

pytestmark = [pytest.mark.timeout(240), pytest.mark.processes]

RECORDS = 6
REJECTED = [1, 2, 4]
DLQ = "dlq.g"


async def setup(b: BrokerProcess) -> uuid.UUID:
    """Topic `t` with RECORDS records, the dead-letter topic, share.version 2, the group's
    configs: `t`'s id."""
    c = Client(await Conn.open(b.host, b.port))
    await c.create_topic("t")
    await c.create_topic(DLQ, **{"errors.deadletterqueue.group.enable": "true"})
    for start in range(0, RECORDS, 2):
        await c.conn.raw(ApiKey.PRODUCE, 9, produce_body(9, "t", 0, batch(start, 2)))
    mod = entities.module(ApiKey.UPDATE_FEATURES, 1, "request")
    r = await call(c.conn, ApiKey.UPDATE_FEATURES, 1, timeout=10000, validate_only=False, feature_updates=(
        entities.make(mod.FeatureUpdateKey, feature="share.version", max_version_level=2, upgrade_type=1),))
    assert int(r.error_code) == E.NONE
    res = entities.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", "AlterConfigsResource")
    cfg = entities.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", "AlterableConfig")
    r = await call(c.conn, ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, validate_only=False, resources=(res(
        resource_type=32, resource_name="g", configs=(
            cfg(name="share.auto.offset.reset", config_operation=0, value="earliest"),
            cfg(name="errors.deadletterqueue.topic.name", config_operation=0, value=DLQ),
            cfg(name="errors.deadletterqueue.copy.record.enable", config_operation=0, value="true"))),))
    assert r.responses[0].error_code.value == 0
    return c.topic_ids["t"]


async def member(b: BrokerProcess, topic_id: uuid.UUID) -> Sharer:
    """A member that holds every record."""
    s = Sharer(await Conn.open(b.host, b.port), "g", topic_id)
    assert await s.heartbeat() == E.NONE
    code, got = await s.fetch(epoch=0, max_records=RECORDS)
    assert code == E.NONE and got[0][2] == [(0, RECORDS - 1, 1)]
    return s


async def dead_letters(bootstrap: str, at_least: int = 0, timeout_s: float = 60) -> list[tuple[int, bytes | None]]:
    """(source offset, value) of every record of dlq.g-0, once there are `at_least` and the
    consumer reached the end."""
    async with AIOConsumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as c:
        tp = TopicPartition(DLQ, 0)
        c.assign([tp])
        c.seek(tp, 0)
        out: list = []
        deadline = time.monotonic() + timeout_s
        while True:
            end = (await c.end_offsets([tp]))[tp]
            if len(out) >= at_least and (c.positions.get(tp) or 0) >= end:
                break
            assert time.monotonic() < deadline, f"{len(out)} dead-letter records, waited for {at_least}"
            out += await c.poll(0.2)
        return [(int(dict(r.headers)["__dlq.errors.offset"]), r.value) for r in out]


def stored(data) -> tuple[int, list, tuple]:
    """(start offset, state batches, pending dead letters) of g's share-partition t-0 as stored."""
    (path,) = list(data.rglob(f"share-state/g/{LOG_NAME}"))
    (state,) = GroupStateLog.read(path).states.values()
    return state.start_offset, list(state.batches), state.dead_letters.pending if state.dead_letters else ()


# answered: whether the member's acknowledgement is answered (None: either; the dead-letter write
# may kill the broker before the answer went out, which it did not wait for)
@pytest.mark.parametrize(("failpoint", "power_loss", "answered"), [
    # (1) ARCHIVING fsynced, never answered: nothing of the dead letters written yet
    ("crash:share:at=synced", False, False),
    # (2) the dead-letter producer written: lost with the power, or kept
    ("crash:share:after=1:at=fsync", True, None),
    ("crash:share:after=1:at=synced", False, None),
    # (3) the dead-letter batch in the page cache (kept by a kill -9, lost by a power cut), or fsynced
    (f"crash:log:match={DLQ}-0", False, None),
    (f"crash:log:match={DLQ}-0:at=fsync", True, None),
    (f"crash:log:match={DLQ}-0:at=synced", False, None),
    # (4) the batch fsynced, the ARCHIVED mark not: found in the partition's producer state
    ("crash:share:after=2:at=fsync", True, None),
    ("crash:share:after=2", False, None),
])
async def test_each_rejected_record_has_one_dead_letter_record_whatever_the_crash(tmp_path, failpoint, power_loss,
                                                                                 answered: bool | None):
    data = tmp_path / "data"
    b = BrokerProcess(data, env={"ONCELOG_FAILPOINTS": LEDGER}).start()
    try:
        topic_id = await setup(b)
        b.stop()   # the failpoints count from here: the member's fetch, its acknowledgement and what follows
        b.env = {"ONCELOG_FAILPOINTS": with_ledger(failpoint)}
        b.start()
        s = await member(b, topic_id)
        acks = [(0, RECORDS - 1, [REJECT if o in REJECTED else ACCEPT for o in range(RECORDS)])]
        try:
            assert (await s.acknowledge(acks))[1] == {0: E.NONE}
            assert answered is not False, "answered, though the broker died in the acknowledgement's write"
        except (EOFError, OSError):
            assert answered is not True
        assert b.proc is not None
        code = await asyncio.to_thread(b.proc.wait, 30)   # it dies on its own, at the failpoint
        assert code == -9, b.log_tail()
        if power_loss:
            lose_unsynced(data)
        b.env = {"ONCELOG_FAILPOINTS": LEDGER}
        b.start()
        # the restarted broker finds what the share-partition owes (without a consumer asking) and
        # writes it: the stored state owes nothing then (read beside it: whole frames only)
        deadline = time.monotonic() + 60
        while stored(data)[2]:
            assert time.monotonic() < deadline, stored(data)
            await asyncio.sleep(0.05)
        b.stop()   # a clean stop writes the last state
        start, batches, pending = stored(data)
        assert pending == () and start == RECORDS, (start, batches, pending)
        b.start()
        got = await dead_letters(b.bootstrap, len(REJECTED))
    finally:
        b.stop()
    assert sorted(o for o, _v in got) == REJECTED, got
    assert dict(got) == {o: b"r%d-%d" % (o - o % 2, o % 2) for o in REJECTED}   # copied (copy.record.enable)
