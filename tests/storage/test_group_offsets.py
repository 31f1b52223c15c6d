"""The groups' files (`storage.group_offsets`): what a restart finds of a group's record, of a
transaction's pending offsets and of the offsets partitions' producer state; files of earlier
formats still load; idle producers' state expires, never with offsets pending."""
from __future__ import annotations

import json

import pytest

from oncelog.core.txn.log_format import partition_for
from oncelog.protocol.errors import ErrorCode as E
from oncelog.storage.fence import Fenced
from oncelog.storage.group_offsets import Committed, GroupMeta, GroupOffsetStore, MemberMeta

GROUP, PID = "copier", 4242
PARTITION = partition_for(GROUP, 50)
TP = ("in", 0)


def test_a_group_record_survives_a_restart(tmp_path):
    meta = GroupMeta("consumer", None, 7, "range", "m-1", (
        MemberMeta("m-1", None, "c1", "/127.0.0.1", 300000, 45000, b"\x00\x01sub", b"\x00\x02\xffassign"),
        MemberMeta("m-2", "inst-2", "c2", "/127.0.0.2", 300000, 10000, b"", b"")))
    store = GroupOffsetStore(tmp_path)
    store.set_meta(GROUP, meta)
    store.commit(GROUP, {TP: Committed(5, "m")})
    again = GroupOffsetStore(tmp_path)
    assert again.meta(GROUP) == meta
    assert again.get(GROUP) == {TP: Committed(5, "m")}
    # a group without offsets keeps its file while its record has members; once empty, it goes
    again.remove(GROUP, [TP])
    assert GroupOffsetStore(tmp_path).meta(GROUP) == meta
    again.remove(GROUP)
    assert GroupOffsetStore(tmp_path).groups() == []


def test_pending_offsets_and_the_offsets_partitions_producer_state_survive_restarts(tmp_path):
    store = GroupOffsetStore(tmp_path)
    assert store.add_pending(PID, 3, GROUP, {TP: Committed(10, None)}, 1) == E.NONE
    assert GroupOffsetStore(tmp_path).apply_marker(PID, 2, 0, True, PARTITION, 2)[0] == E.INVALID_PRODUCER_EPOCH
    assert GroupOffsetStore(tmp_path).add_pending(PID, 2, GROUP, {TP: Committed(9, None)}, 2) \
        == E.INVALID_PRODUCER_EPOCH
    store = GroupOffsetStore(tmp_path)
    assert store.pending() == {PID: {GROUP: {TP: Committed(10, None)}}}
    assert store.apply_marker(PID, 3, 1, True, PARTITION, 3) == (E.NONE, None)
    assert store.get(GROUP) == {TP: Committed(10, None)} and store.pending() == {}
    # nothing pending any more, and still the coordinator epoch of the last marker is known
    store = GroupOffsetStore(tmp_path)
    assert store.add_pending(PID, 3, GROUP, {TP: Committed(20, None)}, 4) == E.NONE
    assert GroupOffsetStore(tmp_path).apply_marker(PID, 3, 0, True, PARTITION, 5)[0] \
        == E.TRANSACTION_COORDINATOR_FENCED
    store = GroupOffsetStore(tmp_path)
    assert store.get(GROUP) == {TP: Committed(10, None)}
    assert store.apply_marker(PID, 3, 1, False, PARTITION, 6) == (E.NONE, None)
    assert store.get(GROUP) == {TP: Committed(10, None)} and store.pending() == {}


def test_a_marker_settles_only_its_own_partitions_groups(tmp_path):
    other = next(g for g in (f"g{i}" for i in range(100)) if partition_for(g, 50) != PARTITION)
    store = GroupOffsetStore(tmp_path)
    store.add_pending(PID, 0, GROUP, {TP: Committed(1, None)}, 1)
    store.add_pending(PID, 0, other, {TP: Committed(2, None)}, 1)
    assert store.apply_marker(PID, 0, 0, True, PARTITION, 2)[0] == E.NONE
    assert store.get(GROUP) == {TP: Committed(1, None)} and store.get(other) == {}
    assert store.pending() == {PID: {other: {TP: Committed(2, None)}}}


def test_files_of_earlier_formats_load(tmp_path):
    (tmp_path / "old-group.json").write_text(json.dumps({
        "format": 2, "protocol_type": "consumer", "empty_since_ms": 123,
        "offsets": [{"topic": "in", "partition": 0, "offset": 4, "metadata": None}]}))
    (tmp_path / "txn-offsets").mkdir()
    (tmp_path / "txn-offsets" / f"{PID}.json").write_text(json.dumps({
        GROUP: [{"topic": "in", "partition": 0, "offset": 8, "metadata": ""}]}))
    store = GroupOffsetStore(tmp_path)
    assert store.meta("old-group") == GroupMeta("consumer", 123)
    assert store.get("old-group") == {TP: Committed(4, None)}
    assert store.pending() == {PID: {GROUP: {TP: Committed(8, "")}}}
    # no producer state was stored then: the first marker is taken, as it was
    assert store.apply_marker(PID, 0, 0, True, PARTITION, 1)[0] == E.NONE
    assert store.get(GROUP) == {TP: Committed(8, "")}


def test_idle_producers_state_expires_but_never_with_offsets_pending(tmp_path):
    store = GroupOffsetStore(tmp_path)
    store.add_pending(PID, 0, GROUP, {TP: Committed(1, None)}, 1000)
    store.add_pending(PID + 1, 0, GROUP, {TP: Committed(1, None)}, 1000)
    store.apply_marker(PID + 1, 0, 0, False, PARTITION, 1000)
    assert store.expire_producers(1000 + 99, 100) == 0
    assert store.expire_producers(1000 + 100, 100) == 1
    assert [str(p.relative_to(tmp_path / "txn-offsets")) for p in (tmp_path / "txn-offsets").glob("*/*")] \
        == [f"{PARTITION}/{PID}.records"]
    assert GroupOffsetStore(tmp_path).pending() == {PID: {GROUP: {TP: Committed(1, None)}}}


def test_a_deposed_owner_of_an_offsets_partition_writes_nothing(tmp_path):
    """Two brokers sharing the directory: the one that owned the group's offsets partition was
    paused while the other took it over; what it then tries to write is refused, what it wrote
    before is the new owner's."""
    old, new = GroupOffsetStore(tmp_path, shared=True), GroupOffsetStore(tmp_path, shared=True)
    with pytest.raises(Fenced):            # nobody writes a partition it does not hold
        old.commit(GROUP, {TP: Committed(1, None)})
    old.take(PARTITION, 1)
    old.commit(GROUP, {TP: Committed(5, None)})
    assert old.add_pending(PID, 0, GROUP, {TP: Committed(7, None)}, 1) == E.NONE
    new.take(PARTITION, 2)
    assert not old.owns(PARTITION) and new.owns(PARTITION)
    assert new.get(GROUP) == {TP: Committed(5, None)}
    assert new.pending(PARTITION) == {PID: {GROUP: {TP: Committed(7, None)}}}
    for write in (lambda: old.commit(GROUP, {TP: Committed(150, None)}),
                  lambda: old.add_pending(PID, 0, GROUP, {TP: Committed(150, None)}, 2),
                  lambda: old.apply_marker(PID, 0, 0, True, PARTITION, 2),
                  lambda: old.set_meta(GROUP, GroupMeta("consumer", 3)),
                  lambda: old.remove(GROUP)):
        with pytest.raises(Fenced):
            write()
    assert new.get(GROUP) == {TP: Committed(5, None)}
    assert new.pending(PARTITION) == {PID: {GROUP: {TP: Committed(7, None)}}}
    assert old.expire_producers(10**12, 1) == 0 and new.pending(PARTITION)
    with pytest.raises(Fenced):
        old.take(PARTITION, 1)             # a stale view never takes it back
    assert new.apply_marker(PID, 0, 0, True, PARTITION, 3) == (E.NONE, None)
    assert new.get(GROUP) == {TP: Committed(7, None)}


def test_a_v2_offsets_marker_needs_an_epoch_above_pending_offsets(tmp_path):
    """Transactions V2: T1's marker carries the epoch T2 then runs at; a late copy of it must
    not settle T2's offsets (KIP-1228)."""
    store = GroupOffsetStore(tmp_path)
    assert store.add_pending(PID, 1, GROUP, {TP: Committed(10, None)}, 1) == E.NONE   # T1 at epoch 1
    assert store.apply_marker(PID, 2, 0, True, PARTITION, 2, transaction_version=2) == (E.NONE, None)
    assert store.add_pending(PID, 2, GROUP, {TP: Committed(20, None)}, 3) == E.NONE   # T2 at epoch 2
    code, _why = store.apply_marker(PID, 2, 0, True, PARTITION, 4, transaction_version=2)   # T1's, late
    assert code == E.INVALID_PRODUCER_EPOCH
    assert store.get(GROUP) == {TP: Committed(10, None)}
    assert store.pending() == {PID: {GROUP: {TP: Committed(20, None)}}}
    assert store.apply_marker(PID, 3, 0, False, PARTITION, 5, transaction_version=2) == (E.NONE, None)  # T2's abort
    assert store.get(GROUP) == {TP: Committed(10, None)} and store.pending() == {}
    assert store.apply_marker(PID, 3, 0, False, PARTITION, 6, transaction_version=2) == (E.NONE, None)  # exact retry


def test_files_of_one_producer_for_every_partition_are_split(tmp_path):
    other = next(g for g in (f"g{i}" for i in range(1000)) if partition_for(g, 50) != PARTITION)
    (tmp_path / "txn-offsets").mkdir()
    (tmp_path / "txn-offsets" / f"{PID}.json").write_text(json.dumps({"format": 2, "partitions": {
        str(PARTITION): {"epoch": 3, "coordinator_epoch": 1, "updated_ms": 5, "groups": {
            GROUP: [{"topic": "in", "partition": 0, "offset": 8, "metadata": ""}]}},
        str(partition_for(other, 50)): {"epoch": 3, "coordinator_epoch": 1, "updated_ms": 5, "groups": {
            other: [{"topic": "in", "partition": 0, "offset": 9, "metadata": ""}]}}}}))
    store = GroupOffsetStore(tmp_path, shared=True)
    assert not (tmp_path / "txn-offsets" / f"{PID}.json").exists()
    assert store.pending(PARTITION) == {PID: {GROUP: {TP: Committed(8, "")}}}
    assert store.pending() == {PID: {GROUP: {TP: Committed(8, "")}, other: {TP: Committed(9, "")}}}
    store.take(PARTITION, 0)
    assert store.apply_marker(PID, 2, 1, True, PARTITION, 6)[0] == E.INVALID_PRODUCER_EPOCH   # its epoch kept


def test_offsets_written_by_hand_read_back_exactly(tmp_path):
    """A commit's records are JSON written by hand (`_offset_text`, 5 times cheaper than
    json.dumps): every name, metadata and number reads back as it was committed."""
    from oncelog.storage import group_offsets
    odd = {("in", 0): Committed(0, None), ("in", 1): Committed(2**62, 'quote " backslash \\ é \u2028 \x00 ⛄'),
           ("a:b", 7): Committed(5, "", leader_epoch=3, commit_timestamp=17, expire_timestamp=-1)}
    for tp, c in odd.items():
        assert json.loads(group_offsets._offset_text(tp, c)) == group_offsets._offset_json(tp, c)
    store = GroupOffsetStore(tmp_path)
    store.commit("g:\"x\"", odd)
    assert store.add_pending(PID, 0, "g:\"x\"", odd, 1) == E.NONE
    again = GroupOffsetStore(tmp_path)
    assert again.get("g:\"x\"") == odd
    assert again.pending() == {PID: {"g:\"x\"": odd}}
