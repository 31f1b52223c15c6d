"""Snapshot files: our versions of Kafka's testReadWriteSnapshot, testLoadFrom{Empty,Truncated,
Corrupt}SnapshotFile, plus the point of our format: every retained batch survives."""
from __future__ import annotations

import struct
from array import array

import pytest

from oncelog.core.producer_state import ProducerStateConfig, ProducerStateManager
from oncelog.storage import producer_snapshots as snaps

KEY = 0xC0FFEE


def manager(config: ProducerStateConfig | None = None) -> ProducerStateManager:
    return ProducerStateManager(config, hash_key=KEY)


def _state(window=20, producers=50, batches=30) -> ProducerStateManager:
    m = manager(ProducerStateConfig(batches_to_retain=window))
    off = 0
    for pid in range(producers):
        for b in range(batches):
            m.record(pid * 1_000_003, pid % 3, b * 2, b * 2 + 1, off, 1_000 + off, 5_000 + pid)
            off += 2
    return m


def test_read_write_snapshot_keeps_every_retained_batch(tmp_path):
    m = _state()
    path = snaps.write_snapshot(tmp_path, 3000, m.columns())
    assert path.name == "00000000000000003000.pstate"
    offset, cols = snaps.read_snapshot(path)
    assert offset == 3000
    m2 = manager(ProducerStateConfig(batches_to_retain=20))
    m2.load_columns(cols)
    assert list(m2.entries()) == list(m.entries())
    assert all(len(e.batches) == 20 for e in m2.entries())  # Kafka's would hold 1


def test_snapshot_into_smaller_window_keeps_newest(tmp_path):
    m = _state(window=20, producers=3)
    _off, cols = snaps.read_snapshot(snaps.write_snapshot(tmp_path, 10, m.columns()))
    m5 = manager(ProducerStateConfig(batches_to_retain=5))
    m5.load_columns(cols)
    for e, full in zip(m5.entries(), m.entries()):
        assert e.batches == full.batches[-5:]


def test_empty_state_round_trips(tmp_path):
    m = manager()
    _off, cols = snaps.read_snapshot(snaps.write_snapshot(tmp_path, 0, m.columns()))
    m2 = manager()
    m2.load_columns(cols)
    assert len(m2) == 0


@pytest.mark.parametrize("damage", ["empty", "truncated", "flipped", "version", "magic", "trailing"])
def test_damaged_snapshots_are_refused(tmp_path, damage):
    path = snaps.write_snapshot(tmp_path, 100, _state(producers=5).columns())
    data = bytearray(path.read_bytes())
    if damage == "empty":
        data = bytearray()
    elif damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "flipped":
        data[len(data) // 2] ^= 0x40
    elif damage == "version":
        struct.pack_into(">h", data, 4, 5)  # a version this broker does not know
    elif damage == "magic":
        data[0:4] = b"XXXX"
    elif damage == "trailing":
        data += b"\0" * 8
    path.write_bytes(bytes(data))
    with pytest.raises(snaps.CorruptSnapshotError):
        snaps.read_snapshot(path)


def test_set_aside_and_stale_removal(tmp_path, caplog):
    cols = _state(producers=2).columns()
    for off in (10, 20, 30, 40, 50):
        snaps.write_snapshot(tmp_path, off, cols, sync=False)
    bad = snaps.snapshot_path(tmp_path, 50)
    with caplog.at_level("WARNING"):
        moved = snaps.set_aside(bad, "test")
    assert moved.exists() and not bad.exists() and "set aside" in caplog.text
    snaps.remove_stale(tmp_path, log_end_offset=35, keep=2)
    assert [o for o, _ in snaps.list_snapshots(tmp_path)] == [20, 30]
    assert moved.exists()  # kept for inspection


def test_file_name_must_match_offset(tmp_path):
    path = snaps.write_snapshot(tmp_path, 7, _state(producers=1).columns())
    other = snaps.snapshot_path(tmp_path, 8)
    path.rename(other)
    with pytest.raises(snaps.CorruptSnapshotError):
        snaps.read_snapshot(other)


def test_duplicate_producer_in_snapshot_is_refused():
    m = _state(producers=2)
    cols = m.columns()
    cols.pid[1] = cols.pid[0]
    _off, cols2 = snaps.decode_snapshot(snaps.encode_snapshot(1, cols))
    with pytest.raises(ValueError):
        manager(ProducerStateConfig(batches_to_retain=20)).load_columns(cols2)


# ------------------------------------------------ remembered producers (versions 2 and 3)

def _encode_v1(offset: int, cols) -> bytes:
    """A version-1 file as oncelog wrote it before version 2 (no expired producers)."""
    from crc32c import crc32c
    body = struct.pack(">hiiq", 0, cols.stride, len(cols.pid), offset) + b"".join(
        snaps._le_bytes(getattr(cols, name)) for _code, name in snaps._PER_PRODUCER + snaps._PER_BATCH)
    return b"OLPS" + struct.pack(">hI", 1, crc32c(body)) + body


def _encode_v2(offset: int, cols, remembered: list[tuple[int, int, int]]) -> bytes:
    """A version-2 file: remembered producers as (pid, oldest, newest batch offset)."""
    from crc32c import crc32c
    body = struct.pack(">hiiqi", 0, cols.stride, len(cols.pid), offset, len(remembered)) + b"".join(
        snaps._le_bytes(getattr(cols, name)) for _code, name in snaps._PER_PRODUCER + snaps._PER_BATCH)
    for k in range(3):
        body += snaps._le_bytes(array("q", [r[k] for r in remembered]))
    return b"OLPS" + struct.pack(">hI", 2, crc32c(body)) + body


def test_remembered_producers_and_state_start_round_trip(tmp_path):
    m = _state(window=5, producers=6, batches=3)
    m.expired.capacity = 2
    m.remove_expired(5_000 + 86_400_000 + 2)  # producers 0..2 were seen at 5000..5002
    assert len(m.expired) == 1 and len(m) == 3 and m.state_start > 0  # 2 of 3 forgotten for room
    _off, cols = snaps.read_snapshot(snaps.write_snapshot(tmp_path, 500, m.columns()))
    m2 = manager(ProducerStateConfig(batches_to_retain=5))
    m2.load_columns(cols)
    assert sorted(m2.expired.items()) == sorted(m.expired.items())
    assert [len(r.offsets) for _p, r in m2.expired.items()] == [3]  # every retained batch
    assert m2.state_start == m.state_start
    assert list(m2.entries()) == list(m.entries())
    assert snaps.snapshot_path(tmp_path, 500).read_bytes()[4:6] == b"\x00\x04"


def test_version_2_snapshots_are_still_read(tmp_path):
    m = _state(window=5, producers=2, batches=3)
    path = snaps.snapshot_path(tmp_path, 90)
    path.write_bytes(_encode_v2(90, m.columns(), [(77, 10, 14), (78, 20, 20)]))
    offset, cols = snaps.read_snapshot(path)
    m2 = manager(ProducerStateConfig(batches_to_retain=5))
    m2.load_columns(cols)
    assert offset == 90 and list(m2.entries()) == list(m.entries())
    # its oldest and newest batch, and the newest's base offset standing for its last offset
    assert dict(m2.expired.items()) == {77: ((10, 14), 14), 78: ((20,), 20)}
    assert m2.state_start == 0


def test_version_1_snapshots_are_still_read(tmp_path):
    m = _state(window=5, producers=4, batches=3)
    path = snaps.snapshot_path(tmp_path, 36)
    path.write_bytes(_encode_v1(36, m.columns()))
    offset, cols = snaps.read_snapshot(path)
    m2 = manager(ProducerStateConfig(batches_to_retain=5))
    m2.load_columns(cols)
    assert offset == 36 and list(m2.entries()) == list(m.entries()) and len(m2.expired) == 0


def test_a_producer_both_tracked_and_remembered_is_tracked():
    m = _state(window=5, producers=2, batches=2)
    cols = m.columns()._replace(expired_stride=2, expired_pid=array("q", [0]), expired_count=array("H", [2]),
                                expired_end=array("q", [3]), expired_offsets=array("q", [0, 2]))
    _off, cols2 = snaps.decode_snapshot(snaps.encode_snapshot(4, cols))
    m2 = manager(ProducerStateConfig(batches_to_retain=5))
    m2.load_columns(cols2)
    assert 0 in m2 and 0 not in m2.expired


def test_remembered_columns_that_disagree_are_refused():
    m = _state(window=5, producers=1, batches=1)
    cols = m.columns()._replace(expired_stride=2, expired_pid=array("q", [5]), expired_count=array("H", [3]),
                                expired_end=array("q", [3]), expired_offsets=array("q", [0, 2]))
    _off, cols2 = snaps.decode_snapshot(snaps.encode_snapshot(4, cols))
    with pytest.raises(ValueError):
        manager(ProducerStateConfig(batches_to_retain=5)).load_columns(cols2)
