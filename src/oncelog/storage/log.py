"""One partition's log: segment files named by base offset (`storage.segment`: a segment, its
indexes and the cleaner's swap), roll by size and age, retention by time and size, DeleteRecords,
recovery and a flush policy.

Layout of a partition directory, besides each segment's files (`storage.segment`):
    log-start-offset             the log start offset (DeleteRecords, retention), replaced durably
    .clean-shutdown              present only after a clean close: the next open skips the CRC scan
    cleaner-offset-checkpoint    compacted topics: the first offset not yet cleaned (storage.cleaner)
    <offset>.pstate              producer-state snapshots (storage.producer_state_store)

Everything here is header-level: offsets are assigned by patching each batch's base offset, reads
return whole batches found from the index plus a scan of headers, and no record is decoded but
in the one batch a search by time lands in (an in-memory time index, rebuilt with the offset
index, finds where that search starts).

Recovery: after an unclean stop the active (last) segment is scanned and every batch's CRC is
checked; a torn or corrupt tail is cut off with a WARNING naming the file, position and bytes.
Rolled segments were fsynced when they were rolled and are trusted. Indexes are rebuilt from the
segment whenever they are missing or do not match it.

Flush policy: `flush.messages` / `flush.ms` (topic) or `log.flush.interval.messages` /
`log.flush.interval.ms` (broker) force fsyncs in the append path, as in Kafka, counting the
messages above the last fsynced offset. Rolled segments, indexes and the start-offset checkpoint
are always fsynced, and so is the active segment at open after an unclean stop (what recovery
keeps becomes durable before anyone reads it).

Durability: `durable_end_offset` is the offset below which every record is known to be on disk
(the active segment's `synced_size` bytes). A failed fsync leaves no visible partial state: the
active segment is cut back to its synced size (what was written after the last good fsync was
never acknowledged as durable), `sync_generation` counts such cuts so that the partition rebuilds
its producer state, and when even the cut fails, or when it would remove records a write-caching
topic has already shown, the partition goes offline (KAFKA_STORAGE_ERROR for every request, as
Kafka's LogDirFailureChannel does) until a restart recovers it.

Over 600 lines, one concern: `PartitionLog`, the state one partition's log keeps across its
segments (offsets, the durable end, the sync generation, offline), which every method here reads
and changes (Kafka's LocalLog). What stands alone is in `storage.segment`.
"""
from __future__ import annotations

import bisect
import errno
import logging
import os
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from oncelog.core.log_limit import LogLimit, held_back
from oncelog.core.topic_config import cleanup_policies
from oncelog.protocol import records as rec
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.primitives import Buf
from oncelog.protocol.records import iter_record_times
from oncelog.storage import failpoints as fp
from oncelog.storage.durable import fsync_dir, replace_file
from oncelog.storage.segment import (
    CLEANED,
    Entry,
    FileRegion,
    Segment,
    commit_swap,
    finish_interrupted_swaps,
    scan_entries,
    swap_names,
)

log = logging.getLogger(__name__)

LONG_MAX = 2**63 - 1
_OFFSET_AND_LENGTH = struct.Struct(">qi")  # how every entry of every format starts
_HEADER_READ_MAX = 64 << 10  # batch_header_at reads at most this (plus a header) at once
CLEAN_SHUTDOWN = ".clean-shutdown"
START_OFFSET_FILE = "log-start-offset"


@dataclass
class LogConfig:
    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    index_interval_bytes: int = 4096
    message_format_version: str = "3.0"
    message_timestamp_type: str = "CreateTime"
    max_message_bytes: int = 1048588
    write_caching: bool = False
    compression_type: str = "producer"
    cleanup_policy: str = "delete"
    delete_retention_ms: int = 86400000
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX

    @property
    def compact(self) -> bool:
        return "compact" in cleanup_policies(self.cleanup_policy)

    @property
    def delete(self) -> bool:
        return "delete" in cleanup_policies(self.cleanup_policy)

    @classmethod
    def from_topic_config(cls, cfg: Mapping[str, Any]) -> LogConfig:
        """From the typed topic configs of `core.topic_config.effective_topic_config`."""
        names = {"segment.bytes": "segment_bytes", "segment.ms": "segment_ms",
                 "retention.ms": "retention_ms", "retention.bytes": "retention_bytes",
                 "flush.messages": "flush_messages", "flush.ms": "flush_ms",
                 "index.interval.bytes": "index_interval_bytes",
                 "message.format.version": "message_format_version",
                 "message.timestamp.type": "message_timestamp_type",
                 "max.message.bytes": "max_message_bytes", "write.caching": "write_caching",
                 "compression.type": "compression_type", "cleanup.policy": "cleanup_policy",
                 "delete.retention.ms": "delete_retention_ms",
                 "min.cleanable.dirty.ratio": "min_cleanable_dirty_ratio",
                 "min.compaction.lag.ms": "min_compaction_lag_ms",
                 "max.compaction.lag.ms": "max_compaction_lag_ms"}
        return cls(**{attr: cfg[name] for name, attr in names.items() if name in cfg})


class TimestampAndOffset(NamedTuple):
    """A ListOffsets answer by time: the record's offset and timestamp, and the leader epoch
    stamped on its batch (-1 if none)."""
    offset: int
    timestamp: int
    leader_epoch: int


class AppendInfo(NamedTuple):
    first_offset: int
    last_offset: int
    log_append_time: int


class SyncToken(NamedTuple):
    """What one fsync started by `begin_sync` covers."""
    fd: int            # a duplicate of the active segment's descriptor, closed by run_sync
    segment: Segment
    size: int          # the segment's bytes at the start
    end_offset: int    # the log end offset at the start
    generation: int    # sync_generation at the start
    durable_from: int  # durable_end_offset at the start
    started_ms: int


def _storage_error(what: str, e: OSError) -> KafkaProtocolError:
    return KafkaProtocolError(ErrorCode.KAFKA_STORAGE_ERROR, f"{what} failed: {e.strerror or e}")


# A full disk fails every append of every partition while producers retry (ten a second and
# more): the cause is logged a few times a minute per errno, the rest counted into the next line.
_WRITE_FAILURES: dict[int, LogLimit] = {}


def _log_write_failure(path: Path, e: OSError) -> None:
    limit = _WRITE_FAILURES.setdefault(e.errno or 0, LogLimit(burst=3, period_s=60.0))
    write, held = limit.allow(time.monotonic())
    if write:
        log.error("%s: write failed, nothing appended: %s%s", path, e, held_back(held, limit.period_s))



class PartitionLog:
    def __init__(self, directory: Path, config: LogConfig) -> None:
        self.directory = Path(directory)
        self.config = config
        self.segments: list[Segment] = []
        self.log_start_offset = 0
        self.recovered = False      # opened after an unclean stop (no clean-shutdown marker)
        self.truncated_bytes = 0    # torn or corrupt tail bytes that open cut off
        self._roll_callbacks: list[Callable[[int], None]] = []
        self._delete_callbacks: list[Callable[[int], None]] = []
        self._last_flush_ms = 0
        self.leader_epoch = 0  # stamped on appended batches; set by the cluster on a leader change
        self.durable_end_offset = 0  # every record below it is fsynced
        self.sync_generation = 0     # bumped whenever records above the durable end are cut away
        self.offline: str | None = None  # why the partition is offline (a storage failure)
        self.fsyncs = 0   # fsyncs of the active segment for appends (group commit, flush policy, rolls)

    # ------------------------------------------------------------------ open / recovery
    @classmethod
    def open(cls, directory: Path, config: LogConfig, now_ms: int) -> PartitionLog:
        self = cls(directory, config)
        created = not self.directory.exists()
        self.directory.mkdir(parents=True, exist_ok=True)
        if created:  # a power loss must not lose the directory of acknowledged records
            fsync_dir(self.directory.parent)
        self._last_flush_ms = now_ms
        clean_marker = self.directory / CLEAN_SHUTDOWN
        clean = clean_marker.exists()
        try:
            self.log_start_offset = int((self.directory / START_OFFSET_FILE).read_text().strip())
        except (FileNotFoundError, ValueError):
            self.log_start_offset = 0
        finish_interrupted_swaps(self.directory)
        bases = sorted(int(p.stem) for p in self.directory.glob("*.log") if p.stem.isdigit())
        for i, base in enumerate(bases):
            seg = Segment(self.directory, base, now_ms)
            last = i == len(bases) - 1
            valid = seg.load_or_rebuild(config.index_interval_bytes, validate=last and not clean)
            if valid < seg.size:
                log.warning("%s: truncating %d bytes of a torn or corrupt tail at position %d "
                            "(a write cut short by a crash)", seg.path, seg.size - valid, valid)
                self.truncated_bytes += seg.size - valid
                seg.truncate(valid)
            try:
                seg.created_ms = int(os.stat(seg.path).st_mtime * 1000) if seg.size else now_ms
            except OSError:
                pass
            self.segments.append(seg)
        fresh = not self.segments
        if fresh:
            self.segments.append(self._new_segment(self.log_start_offset, now_ms))
        # a start offset beyond the data (all records deleted) keeps the log end there too
        active = self.segments[-1]
        if active.size == 0 and active.next_offset < self.log_start_offset:
            active.next_offset = self.log_start_offset
        # what the log manager's one line after an unclean shutdown counts
        self.recovered = not clean and not fresh
        if clean:
            clean_marker.unlink()
            fsync_dir(self.directory)
        elif not fresh:
            # After a crash the recovered tail may sit only in the page cache: make it durable
            # before anything is read from it, or a power loss could take back what was shown.
            try:
                fp.log_sync(active.fd)
            except OSError as e:
                self._take_offline(f"fsync of {active.path.name} at recovery failed: {e}")
        self.durable_end_offset = self.log_end_offset
        return self

    # ------------------------------------------------------------------ properties
    @property
    def log_end_offset(self) -> int:
        return max(self.segments[-1].next_offset, self.log_start_offset)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def on_roll(self, callback: Callable[[int], None]) -> None:
        self._roll_callbacks.append(callback)

    def on_segments_deleted(self, callback: Callable[[int], None]) -> None:
        self._delete_callbacks.append(callback)

    # ------------------------------------------------------------------ append
    def append(self, batches: Buf, now_ms: int, leader_epoch: int | None = None) -> AppendInfo:
        """Assign offsets to whole, already validated batches and write them: all or nothing.
        A storage failure raises KAFKA_STORAGE_ERROR with nothing of this append left behind (and
        possibly less: see `_sync_failed`)."""
        if self.offline:
            raise KafkaProtocolError(ErrorCode.KAFKA_STORAGE_ERROR, f"{self.directory.name} is offline: {self.offline}")
        buf = rec.writable(batches)
        leader_epoch = self.leader_epoch if leader_epoch is None else leader_epoch
        if not buf:
            raise KafkaProtocolError(ErrorCode.INVALID_RECORD, "empty record set")
        self._maybe_roll(len(buf), now_ms)
        seg = self.segments[-1]
        first = offset = self.log_end_offset
        append_time = -1
        log_append_time = self.config.message_timestamp_type == "LogAppendTime"
        entries = []
        if rec.magic_of(buf) >= 2:
            for pos, h in rec.iter_batches(buf):
                rec.patch_batch(buf, pos, offset, leader_epoch)
                if log_append_time:
                    rec.set_max_timestamp(buf, pos, h, now_ms)
                    append_time = now_ms
                ts = now_ms if log_append_time else h.max_timestamp
                entries.append(Entry(seg.size + pos, h.size, offset, offset + h.last_offset_delta, ts, h))
                offset += h.last_offset_delta + 1
            last = offset - 1
        else:
            last = rec.patch_legacy_offsets(buf, offset)
            entries = list(scan_entries(buf, seg.size))
        try:
            written = fp.log_write(seg.fd, buf, seg.size)
            if written != len(buf):
                raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (a short write: {written} of "
                                            f"{len(buf)} bytes)")
        except OSError as e:
            try:
                fp.log_truncate(seg.fd, seg.size)
            except OSError as cut:
                self._take_offline(f"cannot remove a partial write from {seg.path.name}: {cut}")
            _log_write_failure(seg.path, e)
            raise _storage_error("write", e) from None
        seg.size += len(buf)
        interval = self.config.index_interval_bytes
        for entry in entries:
            seg.add_to_index(entry, interval)
        seg.next_offset = last + 1
        self._flush_if_due(now_ms, first)
        return AppendInfo(first, last, append_time)

    def _maybe_roll(self, incoming: int, now_ms: int) -> None:
        seg = self.segments[-1]
        if seg.size == 0:
            return
        if seg.size + incoming > self.config.segment_bytes or now_ms - seg.created_ms >= self.config.segment_ms:
            self.roll(now_ms)

    def roll(self, now_ms: int) -> None:
        old = self.segments[-1]
        self._sync_active(self.log_end_offset)
        try:
            old.write_index()
            new = self._new_segment(self.log_end_offset, now_ms)
        except OSError as e:
            raise _storage_error("segment roll", e) from None
        self.segments.append(new)
        for cb in self._roll_callbacks:
            cb(new.base_offset)

    def _new_segment(self, base_offset: int, now_ms: int) -> Segment:
        """An empty segment whose name survives a power loss (no record goes into a file that
        might vanish)."""
        seg = Segment(self.directory, base_offset, now_ms)
        try:
            fp.log_sync(seg.fd)
            fsync_dir(self.directory)
        except OSError:
            seg.delete()
            raise
        return seg

    # ------------------------------------------------------------------ group commit
    @property
    def high_watermark(self) -> int:
        """What consumers may read: the fsynced records, or, with write.caching, everything."""
        if self.config.write_caching:
            return self.log_end_offset
        return max(self.durable_end_offset, self.log_start_offset)

    def begin_sync(self, now_ms: int) -> SyncToken | None:
        """An fsync of everything appended so far, to be run by `run_sync` on any thread (the
        descriptor is duplicated, so a roll or close meanwhile cannot pull it away); None when
        there is nothing to sync."""
        if self.offline or self.durable_end_offset >= self.log_end_offset:
            return None
        seg = self.segments[-1]
        return SyncToken(os.dup(seg.fd), seg, seg.size, self.log_end_offset, self.sync_generation,
                         self.durable_end_offset, now_ms)

    @staticmethod
    def run_sync(token: SyncToken) -> None:
        try:
            fp.log_sync(token.fd)
        finally:
            os.close(token.fd)

    def end_sync(self, token: SyncToken, error: BaseException | None) -> None:
        """Back on the appending thread: the records the fsync covered are durable, or, after a
        failure, the unsynced tail is cut (or the partition goes offline: `_sync_failed`)."""
        self.fsyncs += 1
        if error is None:
            if token.generation == self.sync_generation:
                self._mark_durable(token.segment, token.size, token.end_offset)
                self._last_flush_ms = max(self._last_flush_ms, token.started_ms)
            return
        if not isinstance(error, OSError):
            error = OSError(errno.EIO, f"fsync did not complete: {error!r}")
        if token.segment is not self.segments[-1] or self.durable_end_offset > token.durable_from:
            # Another fsync of the same open file (a roll, the flush policy) succeeded meanwhile,
            # possibly because this one had already been told the error (Linux reports a
            # writeback error once per open file): what it declared durable may not be.
            self._take_offline(f"fsync of {token.segment.path.name} failed ({error}) while another "
                               "fsync of it reported success: what is on disk is unknown")
            return
        self._sync_failed(token.segment, error, None)

    # ------------------------------------------------------------------ flush
    def _policy_due(self, now_ms: int) -> bool:
        """Does the flush policy (flush.messages / flush.ms) ask for an fsync now?"""
        unflushed = self.log_end_offset - self.durable_end_offset
        return unflushed > 0 and not self.offline and (
            unflushed >= self.config.flush_messages or now_ms - self._last_flush_ms >= self.config.flush_ms)

    def flush_due(self, now_ms: int) -> bool:
        """What the periodic task asks: the flush policy, or, without write caching, records
        still unsynced (a group commit normally syncs them at once; this catches e.g. a topic
        just switched to write.caching=false, whose consumers wait for that fsync)."""
        return self._policy_due(now_ms) or (
            not self.config.write_caching and not self.offline and self.durable_end_offset < self.log_end_offset)

    def _flush_if_due(self, now_ms: int, appending_from: int | None = None) -> None:
        if self._policy_due(now_ms):
            self.flush(now_ms, appending_from)

    def maybe_flush(self, now_ms: int) -> None:
        """The periodic fsync (see flush_due), run here and now."""
        if self.flush_due(now_ms):
            self.flush(now_ms)

    def flush(self, now_ms: int | None = None, appending_from: int | None = None) -> None:
        self._sync_active(appending_from)
        if now_ms is not None:
            self._last_flush_ms = now_ms

    def _sync_active(self, appending_from: int | None = None) -> None:
        """fsync the active segment. `appending_from`: the first offset of an append in progress
        (not yet acknowledged nor visible). Raises KAFKA_STORAGE_ERROR after `_sync_failed`."""
        seg = self.segments[-1]
        size, end = seg.size, self.log_end_offset
        self.fsyncs += 1
        try:
            fp.log_sync(seg.fd)
        except OSError as e:
            self._sync_failed(seg, e, appending_from)
            raise _storage_error(f"fsync of {seg.path.name}", e) from None
        self._mark_durable(seg, size, end)

    def _mark_durable(self, seg: Segment, size: int, end_offset: int) -> None:
        if size > seg.synced_size:
            seg.synced_size = size
        if end_offset > self.durable_end_offset:
            self.durable_end_offset = end_offset

    def _sync_failed(self, seg: Segment, error: OSError, appending_from: int | None) -> None:
        """After a failed fsync nothing above the durable end can be trusted (Linux may drop the
        dirty pages it could not write): cut the active segment back to its synced size. A
        write-caching topic has shown and acknowledged records above it, which a cut would take
        back: that partition goes offline instead."""
        if self.offline:
            return
        shown = appending_from if appending_from is not None else self.log_end_offset
        if self.config.write_caching and shown > self.durable_end_offset:
            self._take_offline(f"fsync of {seg.path.name} failed ({error}) under records already "
                               f"acknowledged from the page cache (write.caching=true)")
            return
        if seg is not self.segments[-1] or seg.size <= seg.synced_size:
            return
        cut = seg.synced_size
        try:
            fp.log_truncate(seg.fd, cut)
            fp.log_sync(seg.fd)
        except OSError as e:
            self._take_offline(f"fsync of {seg.path.name} failed ({error}) and the cut back to "
                               f"{cut} bytes failed too ({e})")
            return
        dropped = self.log_end_offset - self.durable_end_offset
        seg.size = cut
        seg.trim_index(cut)
        seg.next_offset = self.durable_end_offset
        self.sync_generation += 1
        log.error("%s: fsync failed (%s): cut back to %d bytes, dropping the %d unsynced records from "
                  "offset %d (none was acknowledged as durable)", seg.path, error, cut, dropped,
                  self.durable_end_offset)

    def _take_offline(self, reason: str) -> None:
        self.offline = reason
        log.critical("%s: partition offline until a restart recovers it: %s", self.directory, reason)

    # ------------------------------------------------------------------ reads
    def _check_offset(self, offset: int) -> None:
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise KafkaProtocolError(ErrorCode.OFFSET_OUT_OF_RANGE,
                                     f"offset {offset} is outside {self.log_start_offset}..{self.log_end_offset}")

    def segment_holding(self, offset: int) -> Segment:
        """The segment an offset at or below the log end falls in."""
        return self.segments[self._segment_for(offset)]

    def _segment_for(self, offset: int) -> int:
        bases = [s.base_offset for s in self.segments]
        return max(0, bisect.bisect_right(bases, offset) - 1)

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None,
             min_one: bool = True) -> bytes:
        """Whole entries from the one holding `offset` within max_bytes, none at or above
        `max_offset` (the high watermark); with `min_one` at least one, even above max_bytes,
        without it nothing if the first does not fit. Exactly the bytes of `read_region`."""
        found = self._region(offset, max_bytes, max_offset, min_one)
        if found is None:
            return b""
        seg, position, size, _end = found
        return os.pread(seg.fd, size, position)

    def read_region(self, offset: int, max_bytes: int, max_offset: int | None = None,
                    min_one: bool = True) -> FileRegion | None:
        """`read`'s entries as a region of their segment file, for a Fetch to send without reading
        them (None: nothing to send). Costs a few small reads of entry frames, whatever its size."""
        found = self._region(offset, max_bytes, max_offset, min_one)
        if found is None:
            return None
        seg, position, size, end_offset = found
        return FileRegion(os.dup(seg.fd), position, size, end_offset)

    def _region(self, offset: int, max_bytes: int, max_offset: int | None,
                min_one: bool) -> tuple[Segment, int, int, int] | None:
        """(segment, position, size, end offset) of what `read` answers, or None for nothing.
        Within one segment: the entry holding `offset` (or the first after it), then the entries
        after it while they end within max_bytes of its start; none whose first offset is at or
        above `max_offset`. Entries are found by their frames (`_frames`), from the sparse index
        entries nearest to where the answer starts and ends, so a large answer costs no more
        reads than a small one."""
        if self.offline:
            raise KafkaProtocolError(ErrorCode.KAFKA_STORAGE_ERROR, f"{self.directory.name} is offline: {self.offline}")
        self._check_offset(offset)
        if offset >= (self.log_end_offset if max_offset is None else min(max_offset, self.log_end_offset)):
            return None
        for seg in self.segments[self._segment_for(offset):]:
            first = self._find(seg, offset)
            if first is None:
                continue
            position, size, first_offset, last_offset = first
            if (size > max_bytes and not min_one) or (max_offset is not None and first_offset >= max_offset):
                return None
            end, end_offset = position + size, last_offset + 1
            limit = position + min(max_bytes, seg.size - position)   # where the entries after it must end
            if max_offset is not None and max_offset < seg.next_offset:
                limit = min(limit, self._position_of_first_at(seg, max_offset, end))
            if end < limit:
                # from the index entry before the last one within the limit: the walk meets the
                # last entry that fits (it ends at or after that index entry), and no more
                i = bisect.bisect_right(seg.index_positions, limit) - 2
                start = max(end, seg.index_positions[i]) if i >= 0 else end
                for pos, entry_size, _first, last in self._frames(seg, start):
                    if pos + entry_size > limit:
                        break
                    end, end_offset = pos + entry_size, last + 1
            return seg, position, end - position, end_offset
        return None

    def _position_of_first_at(self, seg: Segment, offset: int, start: int) -> int:
        """The position of the first entry of `seg` at or after `start` whose first offset is
        >= offset (the segment's size if none)."""
        i = bisect.bisect_left(seg.index_offsets, offset) - 1
        for pos, _size, first, _last in self._frames(seg, max(start, seg.index_positions[i]) if i >= 0 else start):
            if first >= offset:
                return pos
        return seg.size

    def _find(self, seg: Segment, offset: int) -> tuple[int, int, int, int] | None:
        """(position, size, first offset, last offset) of the first entry of `seg` whose last
        offset is >= offset."""
        for frame in self._frames(seg, seg.position_for(offset)):
            if frame[3] >= offset:
                return frame
        return None

    def _frames(self, seg: Segment, pos: int) -> Iterator[tuple[int, int, int, int]]:
        """(position, size, first offset, last offset) of each entry of `seg` from `pos` (an
        entry's start) on, ending where a walk over the file with `rec.iter_batches` ends, from
        the entries' first bytes only (`rec.entry_frame`): small entries share a read of an index
        interval, a large one costs a read of its own."""
        chunk = min(self.config.index_interval_bytes, _HEADER_READ_MAX) + rec.FRAME_PREFIX
        frame = rec.entry_frame
        buf: bytes = b""
        base = pos
        while pos < seg.size:
            rel = pos - base
            if rel + rec.FRAME_PREFIX > len(buf) and base + len(buf) < seg.size:
                base, rel = pos, 0
                buf = os.pread(seg.fd, min(chunk, seg.size - pos), pos)
            f = frame(buf, rel, seg.size - pos)
            if f is None:
                return
            yield pos, f.size, f.first_offset, f.last_offset
            pos += f.size

    def iter_batches_from(self, offset: int) -> Iterator[rec.BatchHeader]:
        """v2 batch headers from the batch holding `offset` (for producer-state rebuilds and tail
        lookups); v0/v1 messages carry no producer state and are skipped."""
        self._check_offset(offset)
        for seg in self.segments[self._segment_for(offset):]:
            for e, _chunk in seg.entries_from(seg.position_for(offset)):
                if e.last_offset >= offset and e.header is not None:
                    yield e.header

    def batch_headers_between(self, start: int, end: int) -> Iterator[rec.BatchHeader]:
        """v2 batch headers of the batches holding offsets in [start, end), found through the
        offset index and read only across the byte range the index says they span (restoring
        an expired producer reads this much, not the log tail)."""
        start = max(start, self.log_start_offset)
        if start >= min(end, self.log_end_offset):
            return
        for seg in self.segments[self._segment_for(start):]:
            if seg.base_offset >= end:
                return
            i = bisect.bisect_right(seg.index_offsets, end - 1)
            stop = seg.index_positions[i] if i < len(seg.index_positions) else seg.size
            for e, _chunk in seg.entries_from(seg.position_for(start), stop):
                if e.first_offset >= end:
                    return
                if e.last_offset >= start and e.header is not None:
                    yield e.header

    def batch_header_at(self, offset: int) -> rec.BatchHeader | None:
        """The header of the v2 batch whose base offset is `offset`, or None if the log holds no
        such batch (any more): found through the offset index, then by stepping over the entries
        that lie between the index entry and it by their length fields (fewer than
        index.interval.bytes of them): a read of its header when the index points at it, else
        of at most an index interval more; never a record.
        A batch cut by the log start still counts while its last offset is at or above it."""
        if offset >= self.log_end_offset:
            return None
        seg = self.segments[self._segment_for(offset)]
        if offset < seg.base_offset:
            return None
        pos = seg.position_for(offset)
        unpack, need = _OFFSET_AND_LENGTH.unpack_from, rec.BATCH_OVERHEAD
        size = need  # first the header at the index entry (often the batch itself), then an interval
        interval = min(self.config.index_interval_bytes, _HEADER_READ_MAX) + need
        while pos < seg.size:
            buf = os.pread(seg.fd, min(size, seg.size - pos), pos)
            size = interval
            rel, limit = 0, len(buf) - rec.LOG_OVERHEAD
            while rel <= limit:  # step over the entries before it by their lengths
                first, length = unpack(buf, rel)
                if first >= offset or length <= 0:
                    break
                rel += rec.LOG_OVERHEAD + length
            else:
                pos += rel
                continue
            if first != offset or length <= 0:
                return None  # no batch starts at `offset` (inside one, or a v0/v1 message there)
            if len(buf) - rel < need:
                if rel == 0:
                    return None  # the file ends inside it
                pos, size = pos + rel, need
                continue
            if buf[rel + 16] < 2:
                return None  # a v0/v1 message: its offset is its last
            h = rec.read_batch_header(buf, rel)
            return h if h.last_offset >= self.log_start_offset else None
        return None

    def offset_for_timestamp(self, timestamp: int) -> TimestampAndOffset | None:
        """The first record at or above the log start offset whose timestamp is >= `timestamp`
        (Kafka's LogSegment.findOffsetByTimestamp): the time index gives where to start, batch
        headers are scanned to the first whose max timestamp is >= `timestamp`, and only that
        batch is read record by record (decompressed if it must be)."""
        start = self.log_start_offset
        for seg in self.segments:
            if seg.max_timestamp < timestamp or seg.next_offset <= start:
                continue
            position = max(seg.position_for_timestamp(timestamp), seg.position_for(start))
            for e, _chunk in seg.entries_by_interval(position):
                if e.max_timestamp < timestamp or e.last_offset < start:
                    continue
                entry = os.pread(seg.fd, e.size, e.position)
                for offset, ts in iter_record_times(entry):
                    if ts >= timestamp and offset >= start:
                        epoch = e.header.partition_leader_epoch if e.header is not None else -1
                        return TimestampAndOffset(offset, ts, epoch if epoch >= 0 else -1)
        return None

    def offset_of_max_timestamp(self) -> TimestampAndOffset | None:
        """The first record holding the largest timestamp at or above the log start (ListOffsets
        MAX_TIMESTAMP, -3): segments keep their largest timestamp, so only a first segment cut by
        the log start and holding the largest one is scanned, to leave deleted records out."""
        start = self.log_start_offset
        live = [seg for seg in self.segments if seg.next_offset > start]
        if not live:
            return None
        largest = max((seg.max_timestamp for seg in live[1:]), default=-1)
        if live[0].max_timestamp > largest:
            largest = max(largest, self._max_timestamp_from(live[0], start))
        return self.offset_for_timestamp(largest) if largest >= 0 else None

    def _max_timestamp_from(self, seg: Segment, start: int) -> int:
        if seg.base_offset >= start:
            return seg.max_timestamp
        largest = -1
        for e, _chunk in seg.entries_from(seg.position_for(start)):
            if e.last_offset < start or e.max_timestamp <= largest:
                continue
            if e.first_offset < start:  # the batch the start cuts: its live records only
                entry = os.pread(seg.fd, e.size, e.position)
                largest = max([largest, *(ts for offset, ts in iter_record_times(entry) if offset >= start)])
            else:
                largest = e.max_timestamp
        return largest

    # ------------------------------------------------------------------ deletion
    def _write_start_offset(self) -> None:
        replace_file(self.directory / START_OFFSET_FILE, f"{self.log_start_offset}\n")

    def delete_records_before(self, offset: int) -> None:
        if offset > self.log_end_offset:
            raise KafkaProtocolError(ErrorCode.OFFSET_OUT_OF_RANGE,
                                     f"offset {offset} is beyond the log end {self.log_end_offset}")
        if offset <= self.log_start_offset:
            return
        self.log_start_offset = offset
        self._write_start_offset()
        self._delete_segments_below(offset, "DeleteRecords")

    def _delete_segments_below(self, offset: int, why: str) -> None:
        deleted = 0
        while len(self.segments) > 1 and self.segments[1].base_offset <= offset:
            seg = self.segments.pop(0)
            seg.delete()
            deleted += 1
        if deleted:
            log.info("%s: deleted %d segment(s) below offset %d (%s)", self.directory, deleted, offset, why)
        for cb in self._delete_callbacks:
            cb(self.log_start_offset)

    def enforce_retention(self, now_ms: int) -> int:
        """Delete whole non-active segments beyond retention.ms / retention.bytes; returns how many."""
        cfg = self.config
        if not cfg.delete:  # cleanup.policy=compact: only the cleaner removes records
            return 0
        doomed = 0
        total = self.size_bytes
        for seg in self.segments[:-1]:
            too_old = cfg.retention_ms >= 0 and self._segment_age_ms(seg, now_ms) > cfg.retention_ms
            too_big = cfg.retention_bytes >= 0 and total - seg.size >= cfg.retention_bytes
            if not (too_old or too_big):
                break
            total -= seg.size
            doomed += 1
        if not doomed:
            return 0
        new_start = self.segments[doomed].base_offset
        self.log_start_offset = max(self.log_start_offset, new_start)
        self._write_start_offset()
        self._delete_segments_below(new_start, "retention")
        return doomed

    @staticmethod
    def _segment_age_ms(seg: Segment, now_ms: int) -> int:
        if seg.max_timestamp >= 0:
            return now_ms - seg.max_timestamp
        try:
            return now_ms - int(os.stat(seg.path).st_mtime * 1000)
        except OSError:
            return 0

    def truncate_to(self, offset: int) -> None:
        """Remove every entry at or above `offset` (whole entries)."""
        if offset >= self.log_end_offset:
            return
        while len(self.segments) > 1 and self.segments[-1].base_offset >= offset:
            self.segments.pop().delete()
        seg = self.segments[-1]
        cut = seg.size
        for e, _chunk in seg.entries_from(seg.position_for(offset)):
            if e.last_offset >= offset:
                cut = e.position
                break
        seg.truncate(cut)
        seg.synced_size = min(seg.synced_size, cut)
        seg.load_or_rebuild(self.config.index_interval_bytes, validate=False)
        if seg.size == 0:
            seg.next_offset = max(seg.base_offset, min(offset, self.log_start_offset))
        self.durable_end_offset = min(self.durable_end_offset, self.log_end_offset)

    # ------------------------------------------------------------------ cleaning
    def swap_in(self, old: Segment, now_ms: int, indexed: Segment | None = None) -> Segment | None:
        """Replace a closed segment by its cleaned version (`.cleaned` files already written and
        fsynced; `indexed`: the cleaned file's index, built off the loop): None, and the cleaned
        files removed, if the segment left the log or changed meanwhile (retention,
        DeleteRecords, a truncation). Runs where reads run: a read never sees half a swap, and
        one already done read whole batches from the old file."""
        log_cleaned, txn_cleaned = swap_names(self.directory, old.base_offset, CLEANED)
        if self.offline or old not in self.segments[:-1] or old.fd < 0:
            for p in (log_cleaned, txn_cleaned):
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass
            return None
        commit_swap(self.directory, old.base_offset)
        new = Segment(self.directory, old.base_offset, now_ms)
        if indexed is not None and indexed.size == new.size:
            new.adopt_index(indexed)
        else:
            new.load_or_rebuild(self.config.index_interval_bytes, validate=False)
        new.created_ms = old.created_ms
        self.segments[self.segments.index(old)] = new
        old.close()
        return new

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Flush everything and leave a clean-shutdown marker so the next open skips recovery."""
        if not self.segments or self.segments[-1].fd < 0:
            return
        if self.offline:  # no marker: the next open must recover
            for seg in self.segments:
                seg.close()
            return
        active = self.segments[-1]
        try:
            fp.log_sync(active.fd)
            self._mark_durable(active, active.size, self.log_end_offset)
            active.write_index()
        except OSError as e:
            # a full disk (or a failing one) at shutdown: no clean-shutdown marker, so the next
            # start checks the active segment and rebuilds its index, as after a crash
            for seg in self.segments:
                seg.close()
            log.error("%s: not closed cleanly (%s): the next start recovers it", self.directory,
                      e.strerror or e)
            return
        for seg in self.segments:
            seg.close()
        try:
            (self.directory / CLEAN_SHUTDOWN).touch()
            fsync_dir(self.directory)
        except OSError as e:
            log.error("%s: no clean-shutdown marker (%s): the next start recovers it", self.directory,
                      e.strerror or e)
