"""One segment of a partition's log and the cleaner's crash-safe swap of a segment (Kafka's
LogSegment and the replaceSegments half of its LocalLog).

Files of a segment, named by its base offset:
    00000000000000000000.log       record batches (v2) or v0/v1 messages, exactly as produced
    00000000000000000000.index     (relative offset int32, position int32) every index.interval.bytes;
                                   replaced durably at a roll and at close, rebuilt from the
                                   `.log` whenever it is missing or does not match it
    00000000000000000000.txnindex  aborted transactions whose marker is in the segment (written
                                   and rebuilt by the partition: storage.txn_index)
    <base>.log.cleaned, <base>.txnindex.cleaned, then .swap
                                   a segment the cleaner rewrote, on its way in (`commit_swap`;
                                   `finish_interrupted_swaps` at open discards or finishes it)

`Segment` holds the open `.log` file and its in-memory sparse index and time index; the log
(`storage.log.PartitionLog`) decides what is appended, rolled, synced and cut. This class is not
thread-safe: the log's owner calls it, except for a cleaned file indexed on the cleaner's thread
before anyone else sees it.
"""
from __future__ import annotations

import bisect
import logging
import os
import struct
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from oncelog.core.txn.partition import AbortedTxnIndex
from oncelog.protocol import records as rec
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.primitives import Buf
from oncelog.storage import failpoints as fp
from oncelog.storage.durable import fsync_dir, rename, replace_file

log = logging.getLogger(__name__)

_SCAN_CHUNK = 4 << 20
_INDEX_ENTRY = struct.Struct(">ii")


class Entry(NamedTuple):
    """A v2 batch or a top-level v0/v1 message, as stored."""
    position: int
    size: int
    first_offset: int
    last_offset: int
    max_timestamp: int
    header: rec.BatchHeader | None  # None for v0/v1 messages


def scan_entries(buf: Buf, base_position: int = 0) -> Iterator[Entry]:
    """Complete entries of a chunk of log (any format); stops before an incomplete tail."""
    for pos, h in rec.iter_batches(buf):
        yield Entry(base_position + pos, h.size, h.base_offset, h.last_offset, h.max_timestamp,
                    h if h.magic >= 2 else None)


def _check_entry(buf: Buf, e: Entry, base_position: int) -> None:
    """Recovery's check of a stored entry: framing and CRC. Not the produce-time record counts: a
    batch rewritten by the cleaner keeps its last offset delta with fewer records, or none."""
    pos = e.position - base_position
    if e.header is not None:
        if e.header.magic != 2:
            raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, f"record batch magic {e.header.magic}")
        rec.check_crc(buf, pos, e.header)
    else:
        rec.validate_legacy_message_set(memoryview(buf)[pos:pos + e.size])


CLEANED, SWAP = ".cleaned", ".swap"


def swap_names(directory: Path, base_offset: int, suffix: str) -> tuple[Path, Path]:
    """The log and txnindex files of a cleaned segment under `suffix` (".cleaned" or ".swap")."""
    stem = f"{base_offset:020d}"
    return directory / f"{stem}.log{suffix}", directory / f"{stem}.txnindex{suffix}"


def commit_swap(directory: Path, base_offset: int) -> None:
    """Put a cleaned segment written as `.cleaned` files (both fsynced) in place of the segment
    with the same base offset, crash-safely (Kafka's replaceSegments): the txnindex becomes
    `.swap`, then the log; that rename is the commit point, after which recovery finishes the
    swap; before it, recovery discards what was written. Then both take their final names."""
    log_cleaned, txn_cleaned = swap_names(directory, base_offset, CLEANED)
    log_swap, txn_swap = swap_names(directory, base_offset, SWAP)
    rename(txn_cleaned, txn_swap, via=fp.log_rename)
    rename(log_cleaned, log_swap, via=fp.log_rename)  # the commit point
    _finish_swap(directory, log_swap)
    fsync_dir(directory)  # the stale index's removal


def _finish_swap(directory: Path, log_swap: Path) -> None:
    stem = log_swap.name[:-len(".log" + SWAP)]
    txn_swap = directory / f"{stem}.txnindex{SWAP}"
    if txn_swap.exists():
        rename(txn_swap, directory / f"{stem}.txnindex", via=fp.log_rename)
    rename(log_swap, directory / f"{stem}.log", via=fp.log_rename)
    try:
        (directory / f"{stem}.index").unlink()  # positions of the old file: rebuilt at open
    except FileNotFoundError:
        pass


def finish_interrupted_swaps(directory: Path) -> None:
    """At open, before segments are read: a cleaning that died before its commit point leaves
    `.cleaned` files and perhaps a txnindex `.swap` (discarded: the old segment is intact); one
    that died after it leaves the log `.swap` (finished: it is complete and fsynced)."""
    changed = False
    for p in sorted(directory.glob(f"*{CLEANED}")):
        p.unlink()
        changed = True
    for p in sorted(directory.glob(f"*.log{SWAP}")):
        log.warning("%s: finishing a cleaned segment's swap interrupted by a crash", p)
        _finish_swap(directory, p)
        changed = True
    for p in sorted(directory.glob(f"*.txnindex{SWAP}")):
        p.unlink()  # its log never reached `.swap`
        changed = True
    if changed:
        fsync_dir(directory)




class FileRegion:
    """Whole entries of a segment file as a Fetch answers them, not read: the broker's connection
    sends them with os.sendfile (Kafka's FileRecords.writeTo) or, where it cannot (TLS), reads them
    once. It holds its own duplicate of the segment's descriptor, so a roll, a retention delete or
    a cleaner's swap between the answer and its sending cannot take the bytes away; `close` (or
    the region's end, when nothing sent it) releases the descriptor. `end_offset`: the offset
    after its last entry's last record (what read_committed's aborted-transaction lookup needs)."""

    __slots__ = ("fd", "position", "size", "end_offset")

    def __init__(self, fd: int, position: int, size: int, end_offset: int) -> None:
        self.fd = fd
        self.position = position
        self.size = size
        self.end_offset = end_offset

    def __len__(self) -> int:
        return self.size

    def read(self, skip: int = 0) -> bytes:
        """Its bytes from `skip` on (what a partial sendfile left), then closed."""
        try:
            want = self.size - skip
            data = os.pread(self.fd, want, self.position + skip)
            if len(data) != want:
                raise OSError(f"segment file ended {want - len(data)} bytes short of a region read from it")
            return data
        finally:
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()


class Segment:
    """One `.log` file and its in-memory sparse index (first offset of an entry -> position)."""

    def __init__(self, directory: Path, base_offset: int, now_ms: int, path: Path | None = None) -> None:
        """`path`: another file than `<base>.log` (the cleaner's `.cleaned` file, indexed on its
        thread before the swap)."""
        self.base_offset = base_offset
        self.path = path or directory / f"{base_offset:020d}.log"
        self.index_path = directory / f"{base_offset:020d}.index"
        # Kafka's `.txnindex`: the aborted transactions whose ABORT marker is in this segment;
        # the partition loads, appends and rebuilds it (storage.txn_index), the log deletes it
        self.txn_index_path = directory / f"{base_offset:020d}.txnindex"
        self.aborted: AbortedTxnIndex | None = None  # once the partition loaded it
        self.txn_index_written = 0  # entries of `aborted` in the file
        self.txn_index_dirty = False  # entries written since the file's last fsync
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = os.fstat(self.fd).st_size
        self.synced_size = self.size  # bytes known to be on disk; the log lowers it for an unsynced tail
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.created_ms = now_ms
        self.index_offsets = array("q")
        self.index_positions = array("q")
        # the time index: the largest timestamp of the entries before each index entry, a
        # non-decreasing array, so a bisect finds where a search by time must start
        self.index_max_before = array("q")
        self._since_index = 0

    # ---------------------------------------------------------------- index
    def add_to_index(self, entry: Entry, interval: int) -> None:
        if not self.index_offsets or self._since_index >= interval:
            self.index_offsets.append(entry.first_offset)
            self.index_positions.append(entry.position)
            self.index_max_before.append(self.max_timestamp)
            self._since_index = 0
        self._since_index += entry.size
        self.next_offset = entry.last_offset + 1
        if entry.max_timestamp > self.max_timestamp:
            self.max_timestamp = entry.max_timestamp

    def load_or_rebuild(self, interval: int, validate: bool) -> int:
        """Scan the file (checking CRCs when `validate`); returns the byte length of the valid prefix."""
        self.index_offsets, self.index_positions = array("q"), array("q")
        self.index_max_before = array("q")
        self._since_index = 0
        self.next_offset, self.max_timestamp = self.base_offset, -1
        valid = 0
        pos = 0
        while pos < self.size:
            chunk = os.pread(self.fd, max(_SCAN_CHUNK, 0), pos)
            progressed = False
            for e in scan_entries(chunk, pos):
                if validate:
                    try:
                        _check_entry(chunk, e, pos)
                    except KafkaProtocolError as exc:
                        log.warning("%s: entry at position %d fails validation (%s)", self.path, e.position,
                                    exc.message)
                        return valid
                self.add_to_index(e, interval)
                valid = e.position + e.size
                progressed = True
            if not progressed:
                if pos + len(chunk) >= self.size:
                    break  # a torn tail
                # an entry larger than the chunk: read exactly it
                head = os.pread(self.fd, rec.LOG_OVERHEAD, pos)
                need = rec.LOG_OVERHEAD + struct.unpack_from(">i", head, 8)[0] if len(head) == 12 else 0
                if need <= len(chunk) or pos + need > self.size:
                    break
                chunk = os.pread(self.fd, need, pos)
                entries = list(scan_entries(chunk, pos))
                if not entries:
                    break
                if validate:
                    try:
                        _check_entry(chunk, entries[0], pos)
                    except KafkaProtocolError:
                        return valid
                self.add_to_index(entries[0], interval)
                valid = entries[0].position + entries[0].size
            pos = valid
        return valid

    def write_index(self) -> None:
        data = bytearray()
        for off, position in zip(self.index_offsets, self.index_positions):
            data += _INDEX_ENTRY.pack(off - self.base_offset, position)
        replace_file(self.index_path, bytes(data))

    def adopt_index(self, other: Segment) -> None:
        """Take the index another Segment built of this same file (under its earlier name)."""
        self.index_offsets, self.index_positions = other.index_offsets, other.index_positions
        self.index_max_before, self._since_index = other.index_max_before, other._since_index
        self.next_offset, self.max_timestamp = other.next_offset, other.max_timestamp

    def trim_index(self, size: int) -> None:
        """Forget index entries at or beyond `size` (the segment was cut there)."""
        i = bisect.bisect_left(self.index_positions, size)
        del self.index_offsets[i:]
        del self.index_positions[i:]
        self._since_index = size - self.index_positions[-1] if self.index_positions else size

    def position_for(self, offset: int) -> int:
        i = bisect.bisect_right(self.index_offsets, offset) - 1
        return self.index_positions[i] if i >= 0 else 0

    def position_for_timestamp(self, timestamp: int) -> int:
        """Where the first entry whose max timestamp is >= `timestamp` may start: every entry
        before the returned position has a smaller timestamp."""
        i = bisect.bisect_left(self.index_max_before, timestamp) - 1
        return self.index_positions[i] if i >= 0 else 0

    def entries_by_interval(self, position: int) -> Iterator[tuple[Entry, bytes]]:
        """`entries_from`, read one index interval at a time: a search that usually ends in the
        first interval reads about index.interval.bytes, not a whole scan chunk."""
        i = bisect.bisect_right(self.index_positions, position)
        while position < self.size:
            end = self.index_positions[i] if i < len(self.index_positions) else self.size
            yield from self.entries_from(position, end)
            position, i = end, i + 1

    # ---------------------------------------------------------------- io
    def entries_from(self, position: int, end: int | None = None) -> Iterator[tuple[Entry, bytes]]:
        """(entry, chunk holding it) from `position` to `end`, reading in large chunks."""
        end = self.size if end is None else end
        pos = position
        while pos < end:
            chunk = os.pread(self.fd, min(_SCAN_CHUNK, end - pos), pos)
            last = pos
            for e in scan_entries(chunk, pos):
                yield e, chunk
                last = e.position + e.size
            if last == pos:  # an entry larger than the chunk
                head = os.pread(self.fd, rec.LOG_OVERHEAD, pos)
                if len(head) < rec.LOG_OVERHEAD:
                    return
                need = rec.LOG_OVERHEAD + struct.unpack_from(">i", head, 8)[0]
                chunk = os.pread(self.fd, need, pos)
                entries = list(scan_entries(chunk, pos))
                if not entries:
                    return
                yield entries[0], chunk
                last = pos + entries[0].size
            pos = last

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        self.size = size

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def delete(self) -> None:
        self.close()
        for p in (self.path, self.index_path, self.txn_index_path):
            try:
                p.unlink()
            except FileNotFoundError:
                pass


