"""Share groups' state logs (`storage.share_state`): one write of many share-partitions' states,
made durable by one fsync; what a restart reads (the latest frame of each, a torn tail ignored and
cut by the next write); compaction; a failed write or fsync cut back to what was durable; a stale
state epoch refused; the older one-file-per-share-partition format folded in."""
from __future__ import annotations

import json
import uuid

import pytest

from oncelog.core.share.partition import ARCHIVED, AVAILABLE, StateBatch
from oncelog.storage import failpoints as fp
from oncelog.storage import share_state
from oncelog.storage.share_state import LOG_NAME, ShareState, ShareStateStore, StaleStateEpoch

T = uuid.UUID("00000000-0000-0000-0000-0000000000aa")


def state(start: int, *batches: tuple[int, int, int, int], epoch: int = 0) -> ShareState:
    return ShareState(epoch, start, tuple(StateBatch(*b) for b in batches))


def write_synced(store: ShareStateStore, group: str, states) -> None:
    pending = store.write(group, states)
    if pending is not None:
        store.sync(pending)
        store.synced(pending)


@pytest.fixture
def failpoints():
    yield fp.configure
    fp.configure(None)


def test_many_share_partitions_in_one_write_and_one_fsync_survive_a_restart(tmp_path, failpoints, monkeypatch):
    store = ShareStateStore(tmp_path)
    assert store.write("g", {(T, 0): state(0)}) is None    # a new log: created whole, durable at once
    failpoints("ledger:share")
    fsyncs = []
    real = fp.os.fsync
    monkeypatch.setattr(fp.os, "fsync", lambda fd: (fsyncs.append(fd), real(fd))[1])
    states = {(T, p): state(10 * p, (10 * p, 10 * p + 4, AVAILABLE, 1), (10 * p + 5, 10 * p + 5, ARCHIVED, 0))
              for p in range(8)}
    pending = store.write("g", states)
    assert pending is not None
    store.sync(pending)
    store.synced(pending)
    assert len(fsyncs) == 1
    again = ShareStateStore(tmp_path)
    assert {k: again.read("g", *k) for k in states} == states
    assert list(again.partitions("g")) == sorted(states, key=lambda k: (str(k[0]), k[1]))
    assert again.read_summary("g", T, 3) == (0, 30)
    assert again.groups() == ["g"] and again.has_group("g") and not again.has_group("other")


def test_a_torn_tail_is_ignored_and_cut_by_the_next_write(tmp_path):
    store = ShareStateStore(tmp_path)
    write_synced(store, "g", {(T, 0): state(0)})
    write_synced(store, "g", {(T, 0): state(3)})
    path = tmp_path / "g" / LOG_NAME
    whole = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x01\x00garbage")    # a frame the crash left half written
    again = ShareStateStore(tmp_path)
    assert again.read("g", T, 0) == state(3)
    write_synced(again, "g", {(T, 1): state(7)})
    third = ShareStateStore(tmp_path)
    assert third.read("g", T, 0) == state(3) and third.read("g", T, 1) == state(7)
    assert path.stat().st_size > whole and b"garbage" not in path.read_bytes()


def test_the_log_is_compacted_to_its_live_frames(tmp_path, monkeypatch):
    monkeypatch.setattr(share_state, "COMPACT_SLACK_BYTES", 4096)
    store = ShareStateStore(tmp_path)
    for i in range(500):
        write_synced(store, "g", {(T, 0): state(i), (T, 1): state(2 * i)})
    assert (tmp_path / "g" / LOG_NAME).stat().st_size < 3 * 4096
    again = ShareStateStore(tmp_path)
    assert again.read("g", T, 0) == state(499) and again.read("g", T, 1) == state(998)


def test_a_stale_state_epoch_is_refused_and_writes_nothing(tmp_path):
    store = ShareStateStore(tmp_path)
    write_synced(store, "g", {(T, 0): state(5, epoch=2)})
    with pytest.raises(StaleStateEpoch):
        store.write("g", {(T, 0): state(9, epoch=1), (T, 1): state(1, epoch=1)})
    again = ShareStateStore(tmp_path)
    assert again.read("g", T, 0) == state(5, epoch=2) and again.read("g", T, 1) is None


@pytest.mark.parametrize("spec", ["enospc:share", "shortwrite:share"])
def test_a_failed_write_leaves_nothing_of_it(tmp_path, failpoints, spec):
    store = ShareStateStore(tmp_path)
    write_synced(store, "g", {(T, 0): state(1)})
    failpoints(spec)
    with pytest.raises(OSError):
        store.write("g", {(T, 0): state(2), (T, 1): state(2)})
    failpoints(None)
    assert ShareStateStore(tmp_path).read("g", T, 0) == state(1)
    write_synced(store, "g", {(T, 1): state(4)})
    again = ShareStateStore(tmp_path)
    assert again.read("g", T, 0) == state(1) and again.read("g", T, 1) == state(4)


def test_a_failed_fsync_cuts_back_to_what_was_durable(tmp_path, failpoints):
    store = ShareStateStore(tmp_path)
    write_synced(store, "g", {(T, 0): state(1)})
    durable = (tmp_path / "g" / LOG_NAME).stat().st_size
    pending = store.write("g", {(T, 0): state(2)})
    assert pending is not None
    failpoints("fsync-eio:share")
    with pytest.raises(OSError):
        store.sync(pending)
    store.sync_failed(pending, OSError(5, "EIO"))
    failpoints(None)
    assert (tmp_path / "g" / LOG_NAME).stat().st_size == durable
    assert ShareStateStore(tmp_path).read("g", T, 0) == state(1)
    write_synced(store, "g", {(T, 0): state(3)})   # the log goes on after the cut
    assert ShareStateStore(tmp_path).read("g", T, 0) == state(3)


def test_the_older_format_is_read_and_folded_into_the_log(tmp_path):
    d = tmp_path / "g%2Fx"
    d.mkdir()
    (d / f"{T}-0.json").write_text(json.dumps({"format": 1, "state_epoch": 0, "start_offset": 4,
                                               "batches": [[4, 6, AVAILABLE, 2]]}))
    (d / f"{T}-1.json").write_text(json.dumps({"format": 1, "state_epoch": 1, "start_offset": 9, "batches": []}))
    store = ShareStateStore(tmp_path)
    assert store.groups() == ["g/x"]
    assert store.read("g/x", T, 0) == state(4, (4, 6, AVAILABLE, 2))
    write_synced(store, "g/x", {(T, 2): state(0)})
    assert sorted(p.name for p in d.iterdir()) == [LOG_NAME]
    again = ShareStateStore(tmp_path)
    assert again.read("g/x", T, 0) == state(4, (4, 6, AVAILABLE, 2))
    assert again.read("g/x", T, 1) == state(9, epoch=1) and again.read("g/x", T, 2) == state(0)


def test_delete_takes_the_groups_state(tmp_path):
    store = ShareStateStore(tmp_path)
    write_synced(store, "g", {(T, 0): state(1)})
    store.delete("g")
    assert store.groups() == [] and store.read("g", T, 0) is None
    assert ShareStateStore(tmp_path).read("g", T, 0) is None
