"""A share group's acknowledgements across a broker crash in the middle of their state write, against
a real broker process (kill -9 by the storage failpoint `crash:share`, then a restart on the same
data): KIP-932's promise as oncelog keeps it. A record acknowledged ACCEPT whose state write was
fsynced is never delivered again, even if the broker died before it answered; one whose write was
not fsynced may come back (after a power cut it does: the emulated cut keeps only what an fsync
covered); and no record is lost either way: every one is delivered again or stays accepted, with
its delivery counted."""
from __future__ import annotations

import pytest
from test_dedup_raw import Client, Conn, batch, produce_body
from test_share_group_protocol import ACCEPT, Sharer, call

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.power_loss import LEDGER, lose_unsynced, with_ledger

pytestmark = [pytest.mark.timeout(180), pytest.mark.processes]

RECORDS = 10


async def setup(b: BrokerProcess) -> Client:
    c = Client(await Conn.open(b.host, b.port))
    await c.create_topic("t")
    for start in range(0, RECORDS, 2):
        await c.conn.raw(ApiKey.PRODUCE, 9, produce_body(9, "t", 0, batch(start, 2)))
    res = entities.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", "AlterConfigsResource")
    cfg = entities.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", "AlterableConfig")
    r = await call(c.conn, ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, validate_only=False, resources=(res(
        resource_type=32, resource_name="g", configs=(
            cfg(name="share.auto.offset.reset", config_operation=0, value="earliest"),)),))
    assert r.responses[0].error_code.value == 0
    return c


async def member(b: BrokerProcess, c: Client) -> Sharer:
    s = Sharer(await Conn.open(b.host, b.port), "g", c.topic_ids["t"])
    assert await s.heartbeat() == E.NONE
    return s


@pytest.mark.parametrize(("at", "power_loss", "come_back"), [
    ("fsync", True, range(RECORDS)),    # written, not fsynced, and the power cut takes it: all come back
    ("fsync", False, range(5, RECORDS)),   # written, not fsynced; a kill -9 keeps the page cache
    ("synced", False, range(5, RECORDS)),  # fsynced, never answered: the accepted ones stay accepted
])
async def test_accepted_records_across_a_crash_in_their_state_write(tmp_path, at, power_loss, come_back):
    data = tmp_path / "data"
    # the group's first write creates its log whole (durable); the first fsync of the share-state
    # target is the acknowledgement's write
    b = BrokerProcess(data, env={"ONCELOG_FAILPOINTS": with_ledger(f"crash:share:at={at}")}).start()
    try:
        c = await setup(b)
        a = await member(b, c)
        code, got = await a.fetch(epoch=0, max_records=RECORDS)
        assert code == E.NONE and got[0][2] == [(0, RECORDS - 1, 1)]
        with pytest.raises((EOFError, OSError)):   # the broker dies in the acknowledgement's write
            await a.acknowledge([(0, 4, [ACCEPT])])
        assert b.proc is not None and b.proc.wait(10) == -9
        if power_loss:
            lose_unsynced(data)
        b.env = {"ONCELOG_FAILPOINTS": LEDGER}
        b.start()
        c = Client(await Conn.open(b.host, b.port))
        c.topic_ids["t"] = a.topic_id
        s = await member(b, c)
        code, got = await s.fetch(epoch=0, max_records=100)
        assert code == E.NONE
        assert got[0][2] == [(come_back[0], come_back[-1], 2)]   # their first delivery was counted
        # none lost: what came back is accepted now, and nothing else is left
        assert (await s.acknowledge([(come_back[0], come_back[-1], [ACCEPT])]))[1][0] == E.NONE
        assert (await s.fetch(max_records=100))[1] == {}
    finally:
        b.stop()
