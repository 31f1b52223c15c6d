"""Producer-state snapshot files: every retained batch of every producer, versioned, CRC-32C.

Kafka's snapshot keeps only each producer's last batch, so its dedup window shrinks to one batch
after a restart; ours stores the whole rings so the window is whole again after a restart.

File `<offset:020d>.pstate` in the partition directory; `offset` is exclusive (the state covers
the log below it), as Kafka's `.snapshot`. Layout (header big-endian, columns little-endian so
the in-memory arrays are written and read without per-producer work):

    magic "OLPS" | version i16 = 4 | crc u32 (CRC-32C of every byte after it) |
    flags i16 = 0 | stride i32 | producers i32 | map end offset i64 |
    remembered producers i32 (m) | remembered stride i32 (r) | producer-state start offset i64 |
    open transactions i32 (t) |
    pid q[n] | epoch h[n] | last update ms q[n] | ring head H[n] | ring count H[n] |
    first seq i[n*stride] | last seq i[n*stride] | base offset q[n*stride] | timestamp q[n*stride] |
    remembered pid q[m] | batch count H[m] | last offset of the newest batch q[m] |
    base offsets of the retained batches q[m*r] |
    coordinator epoch i[n] | open transaction's producer id q[t] | its first offset q[t]

Version 4 (transactions) adds each producer's last coordinator epoch (-1: none) and the open
transactions at the snapshot's offset, Kafka's CoordinatorEpoch and CurrentTxnFirstOffset;
older versions are read with no coordinator epochs and no open transaction (oncelog refused
transactional batches before v4, so their logs hold none).

Version 3 remembers the offset of every retained batch of an expired or evicted producer (so a
restore reads each batch's header, not the log between them), the last offset of its newest
batch, and the producer-state start offset (ProducerStateManager.state_start). Version 2 kept
the remembered producers' oldest and newest batch offsets only: it is read with those two
batches remembered (the newest's last offset taken as its base offset). Version 1 (no
remembered producers) is read with none remembered.
"""
from __future__ import annotations

import logging
import os
import struct
import sys
from array import array
from collections.abc import Iterable
from pathlib import Path

from crc32c import crc32c

from oncelog.core.producer_state import ProducerSnapshotColumns
from oncelog.storage.durable import TMP_SUFFIX, rename, replace_file

log = logging.getLogger(__name__)

MAGIC = b"OLPS"
VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
SUFFIX = ".pstate"
CORRUPT_SUFFIX = ".corrupt"
_HEAD = struct.Struct(">4shI")          # magic, version, crc
_BODY_HEAD_V1 = struct.Struct(">hiiq")  # flags, stride, producers, map end offset
_BODY_HEAD_V2 = struct.Struct(">hiiqi")  # ... and expired producers remembered
_BODY_HEAD_V3 = struct.Struct(">hiiqiiq")  # ... and (v3) remembered stride, producer-state start offset
_BODY_HEAD = struct.Struct(">hiiqiiqi")  # ... and (v4) open transactions
_BODY_HEADS = {1: _BODY_HEAD_V1, 2: _BODY_HEAD_V2, 3: _BODY_HEAD_V3, 4: _BODY_HEAD}
_BIG_ENDIAN = sys.byteorder == "big"
_PER_PRODUCER = (("q", "pid"), ("h", "epoch"), ("q", "updated"), ("H", "head"), ("H", "count"))
_PER_BATCH = (("i", "first"), ("i", "last"), ("q", "offset"), ("q", "timestamp"))
_PER_REMEMBERED = (("q", "expired_pid"), ("H", "expired_count"), ("q", "expired_end"))
_PER_EXPIRED_V2 = (("q", "expired_pid"), ("q", "oldest"), ("q", "newest"))
_PER_OPEN_TXN = (("q", "txn_pid"), ("q", "txn_first"))


class CorruptSnapshotError(Exception):
    pass


def snapshot_path(directory: Path, offset: int) -> Path:
    return Path(directory) / f"{offset:020d}{SUFFIX}"


def list_snapshots(directory: Path) -> list[tuple[int, Path]]:
    """(offset, path) of every snapshot file, oldest first."""
    found = []
    for p in Path(directory).glob(f"*{SUFFIX}"):
        stem = p.name[:-len(SUFFIX)]
        if len(stem) == 20 and stem.isdigit():
            found.append((int(stem), p))
    found.sort()
    return found


def _le_bytes(arr: array[int]) -> bytes:
    if _BIG_ENDIAN:
        arr = array(arr.typecode, arr)
        arr.byteswap()
    return arr.tobytes()


def encode_snapshot(offset: int, cols: ProducerSnapshotColumns) -> bytes:
    n = len(cols.pid)
    rstride = cols.expired_stride
    remembered = [getattr(cols, name) if getattr(cols, name) is not None else array(code)
                  for code, name in _PER_REMEMBERED]
    remembered.append(cols.expired_offsets if cols.expired_offsets is not None else array("q"))
    coord = cols.coordinator_epoch if cols.coordinator_epoch is not None else array("i", [-1]) * n
    txn_pid = cols.txn_pid if cols.txn_pid is not None else array("q")
    txn_first = cols.txn_first if cols.txn_first is not None else array("q")
    if len(coord) != n or len(txn_pid) != len(txn_first):
        raise ValueError("snapshot columns disagree in length")
    parts = [_BODY_HEAD.pack(0, cols.stride, n, offset, len(remembered[0]), rstride, cols.state_start,
                             len(txn_pid))]
    for _code, name in _PER_PRODUCER + _PER_BATCH:
        parts.append(_le_bytes(getattr(cols, name)))
    parts += [_le_bytes(arr) for arr in remembered]
    parts += [_le_bytes(array("i", coord)), _le_bytes(array("q", txn_pid)), _le_bytes(array("q", txn_first))]
    body = b"".join(parts)
    return _HEAD.pack(MAGIC, VERSION, crc32c(body)) + body


def decode_snapshot(data: bytes) -> tuple[int, ProducerSnapshotColumns]:
    """Parse and verify a snapshot; raises CorruptSnapshotError on any inconsistency."""
    if len(data) < _HEAD.size + _BODY_HEAD_V1.size:
        raise CorruptSnapshotError(f"snapshot of {len(data)} bytes is shorter than its header")
    magic, version, crc = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise CorruptSnapshotError(f"bad magic {magic!r}")
    if version not in READABLE_VERSIONS:
        raise CorruptSnapshotError(f"unsupported snapshot version {version}")
    body = memoryview(data)[_HEAD.size:]
    if crc32c(body) != crc:
        raise CorruptSnapshotError("snapshot CRC-32C mismatch")
    head = _BODY_HEADS[version]
    if len(body) < head.size:
        raise CorruptSnapshotError("snapshot is truncated")
    _flags, stride, n, offset, *rest = head.unpack_from(body)
    m = rest[0] if rest else 0
    rstride, state_start = rest[1:3] if version >= 3 else (1, 0)
    t = rest[3] if version >= 4 else 0
    if stride < 1 or n < 0 or offset < 0 or m < 0 or rstride < 1 or state_start < 0 or t < 0:
        raise CorruptSnapshotError(f"bad snapshot header (stride {stride}, producers {n}, offset {offset}, "
                                   f"remembered {m} x {rstride}, state start {state_start})")
    pos = head.size
    values = {"stride": stride, "state_start": state_start}
    groups = [(_PER_PRODUCER, n), (_PER_BATCH, n * stride)]
    if version == 2:
        groups.append((_PER_EXPIRED_V2, m))
    elif version >= 3:
        groups += [(_PER_REMEMBERED, m), ((("q", "expired_offsets"),), m * rstride)]
    if version >= 4:
        groups += [((("i", "coordinator_epoch"),), n), (_PER_OPEN_TXN, t)]
    for group, count in groups:
        for code, name in group:
            arr = array(code)
            size = arr.itemsize * count
            if pos + size > len(body):
                raise CorruptSnapshotError("snapshot is truncated")
            arr.frombytes(body[pos:pos + size])
            if _BIG_ENDIAN:
                arr.byteswap()
            values[name] = arr
            pos += size
    if pos != len(body):
        raise CorruptSnapshotError(f"{len(body) - pos} unexpected bytes after the snapshot columns")
    if version == 2:
        values.update(_from_v2(values.pop("oldest"), values.pop("newest")))
    values["expired_stride"] = 2 if version == 2 else rstride
    return offset, ProducerSnapshotColumns(**values)


def _from_v2(oldest: array[int], newest: array[int]) -> dict[str, array[int]]:
    """Version 2's (oldest, newest) batch offsets as version 3's columns (stride 2)."""
    count, offsets = array("H"), array("q")
    for o, w in zip(oldest, newest):
        count.append(1 if o == w else 2)
        offsets.extend((w, 0) if o == w else (o, w))
    return {"expired_count": count, "expired_end": array("q", newest), "expired_offsets": offsets}


def write_snapshot(directory: Path, offset: int, cols: ProducerSnapshotColumns, *, sync: bool = True) -> Path:
    """Write atomically, so a crash leaves the old file or the new one; durably (`storage.durable`)
    with `sync`, else a power cut may lose it (recovery then uses an older one, or the log)."""
    path = snapshot_path(directory, offset)
    replace_file(path, encode_snapshot(offset, cols), durable=sync)
    return path


def read_snapshot(path: Path) -> tuple[int, ProducerSnapshotColumns]:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CorruptSnapshotError(f"cannot read: {exc}") from None
    offset, cols = decode_snapshot(data)
    if snapshot_path(Path(path).parent, offset).name != Path(path).name:
        raise CorruptSnapshotError(f"file name disagrees with its offset {offset}")
    return offset, cols


def set_aside(path: Path, reason: str) -> Path:
    """Rename a bad snapshot out of the way (kept for inspection) and say so in the log."""
    target = Path(path).with_name(Path(path).name + CORRUPT_SUFFIX)
    rename(path, target)
    log.warning("producer snapshot %s is unusable (%s); set aside as %s", path, reason, target.name)
    return target


def delete_snapshots(paths: Iterable[Path]) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def remove_stale(directory: Path, log_end_offset: int, keep: int) -> None:
    """Drop snapshots beyond the log end (after truncation) and all but the newest `keep`."""
    snaps = list_snapshots(directory)
    delete_snapshots(p for off, p in snaps if off > log_end_offset)
    valid = [p for off, p in snaps if off <= log_end_offset]
    delete_snapshots(valid[:-keep] if keep > 0 else valid)
    for tmp in Path(directory).glob(f"*{SUFFIX}{TMP_SUFFIX}"):
        delete_snapshots([tmp])

