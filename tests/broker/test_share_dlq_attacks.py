"""Dead-letter topics (KIP-1191) attacked by a client that may write to the dead-letter topic (a
re-drive tool, the DLQ's own consumers): the broker writes each dead letter as an idempotent
producer of the share-partition's own and, before writing, trusts the dead-letter partition's
producer state to say how far that producer got. The producer id is in every dead-letter batch's
header (any reader of the topic sees it; DescribeProducers lists it), and a Produce may carry any
producer id and epoch: a client that appends a batch under that id, epoch and the next sequences
made the broker take the dead letters owed for written, and mark their records ARCHIVED with no
dead-letter record (the client's records in their place). The broker now finds them in the log as
its own (their headers) before it marks them, and else writes them as a new producer. Against an in-process broker
over real sockets; states are polled for with a deadline."""
from __future__ import annotations

import pytest
from test_dedup_raw import batch, produce_body
from test_share_dlq import DLQ, create_topic, dead_letter_state, features, group_dlq, headers, read, rejecting, until
from test_share_group_protocol import ACCEPT, REJECT, share  # noqa: F401 - fixture

from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E


@pytest.fixture
def sb(share):  # noqa: F811 - test_share_group_protocol's broker, its clock and helpers
    return share


async def test_a_client_writing_under_the_dead_letter_producer_id_cannot_suppress_dead_letters(sb):
    await features(sb, 2)
    await create_topic(sb, DLQ, **{"errors.deadletterqueue.group.enable": "true"})
    await group_dlq(sb)
    _tid, a = await rejecting(sb)
    assert (await a.acknowledge([(0, 0, [REJECT])]))[1] == {0: E.NONE}
    await until(lambda: dead_letter_state(sb) == (0, 1, 0), "the first dead letter written")
    # the attacker reads the producer id and epoch of the dead-letter batch (its header; taken from
    # the share-partition here for brevity) and appends three records under the next sequences
    sp = next(iter(sb["broker"].groups.share.partitions.values()))
    pid, epoch = sp.dlq_producer_id, sp.dlq_producer_epoch
    await (await sb["conn"]()).raw(ApiKey.PRODUCE, 9, produce_body(9, DLQ, 0, batch(1, 3, pid=pid, epoch=epoch)))
    await until(lambda: sb["broker"].logs.get_partition(DLQ, 0).log_end_offset == 4, "the forged batch appended")
    # the member rejects two more records: their dead letters have sequences 1 and 2
    assert (await a.acknowledge([(1, 2, [REJECT]), (3, 4, [ACCEPT])]))[1] == {0: E.NONE}
    await until(lambda: dead_letter_state(sb)[0] == 0, "nothing owed")
    records = await read(sb, DLQ, 6)   # the first, the three forged, and the two owed
    dead = sorted(int(headers(r)["__dlq.errors.offset"]) for r in records if "__dlq.errors.offset" in headers(r))
    assert dead == [0, 1, 2], f"dead-letter records for source offsets {dead}; records 1 and 2 are ARCHIVED"
