"""The `.txnindex` files: one per segment, Kafka's layout (34-byte entries: version i16, producer
id, first offset, last offset = the ABORT marker's offset, last stable offset at completion;
`core.txn.partition.AbortedTxnIndex` packs and encodes them).

Durability: an entry is appended to its segment's file when the ABORT marker is appended, and the
file is fsynced before any producer-state snapshot is written (`sync_dirty`), as a snapshot at
offset S promises that recovery need not look below S. Recovery loads each file, drops the
entries at or above the offset it replays from, and the replay appends them again (`load`,
`truncate_from`). A torn final entry is dropped by the decoder; a file that cannot be read at
all is set aside with a log line and its segment's entries below the replay start are lost (the
consumers of those aborted records would see them: no better source exists without a full
rescan; the log line says so).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from oncelog.core.txn.partition import ENTRY_SIZE, AbortedTxnIndex, CompletedTxn
from oncelog.storage.durable import rename, replace_file

if TYPE_CHECKING:
    from oncelog.storage.segment import Segment

log = logging.getLogger(__name__)


def load(seg: Segment) -> AbortedTxnIndex:
    """The segment's index from its file (empty if there is none)."""
    try:
        data = seg.txn_index_path.read_bytes()
    except FileNotFoundError:
        data = b""
    try:
        idx = AbortedTxnIndex.decode(data)
    except ValueError as exc:
        aside = seg.txn_index_path.with_name(seg.txn_index_path.name + ".corrupt")
        rename(seg.txn_index_path, aside)
        log.error("%s is unreadable (%s); set aside as %s: aborted transactions whose markers lie "
                  "below the recovery point of this segment are no longer listed to read_committed "
                  "consumers", seg.txn_index_path, exc, aside.name)
        idx = AbortedTxnIndex()
        data = b""
    seg.aborted = idx
    seg.txn_index_written = len(idx)
    if len(data) % ENTRY_SIZE:  # a torn final entry: rewrite without it
        _rewrite(seg)
    seg.txn_index_dirty = False
    return idx


def index_of(seg: Segment) -> AbortedTxnIndex:
    if seg.aborted is None:
        seg.aborted = AbortedTxnIndex()
        seg.txn_index_written = 0
    return seg.aborted


def truncate_from(seg: Segment, offset: int) -> None:
    """Forget entries whose marker is at or above `offset` (recovery replays them, or the log was
    cut there)."""
    idx = index_of(seg)
    n = len(idx)
    idx.truncate_to(offset)
    if len(idx) != n or seg.txn_index_written != len(idx):
        _rewrite(seg)


def append(seg: Segment, entry: CompletedTxn) -> None:
    """Add one aborted transaction (a `CompletedTxn`) and write it to the file (no fsync)."""
    idx = index_of(seg)
    idx.append(entry)
    data = idx.encode_from(seg.txn_index_written)
    with open(seg.txn_index_path, "ab") as f:
        f.write(data)
    seg.txn_index_written = len(idx)
    seg.txn_index_dirty = True


def sync_dirty(segments: Iterable[Segment]) -> None:
    """fsync every index written since its last fsync (before a snapshot)."""
    for seg in segments:
        if seg.txn_index_dirty:
            fd = os.open(seg.txn_index_path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            seg.txn_index_dirty = False


def _rewrite(seg: Segment) -> None:
    idx = index_of(seg)
    if not len(idx):
        try:
            seg.txn_index_path.unlink()
        except FileNotFoundError:
            pass
    else:
        replace_file(seg.txn_index_path, idx.encode())
    seg.txn_index_written = len(idx)
    seg.txn_index_dirty = False
