"""The log cleaner: compaction of `cleanup.policy=compact` partitions (Kafka's LogCleaner).

One pass over one partition, in three steps:
- `prepare` (where appends run): is a cleaning due (`core.compaction.plan_cleaning`: dirty ratio,
  min/max compaction lag, never the active segment nor above the last stable offset)? It takes
  what the pass needs from live state: the segments, each producer's last batch, the aborted
  transactions.
- `run` (any thread; the broker's cleaner thread): builds the key -> latest offset map over the
  dirty segments (at most `log.cleaner.dedupe.buffer.size` / ENTRY_COST keys; the dirty range
  ends at the last whole segment that fits), then rewrites every closed segment below the end
  of that range into `<base>.log.cleaned` + `<base>.txnindex.cleaned`, fsynced. It reads the
  segment files through descriptors of its own and changes nothing the log uses.
- `commit` (where appends run): each cleaned segment is swapped in (`PartitionLog.swap_in`:
  `.cleaned` -> `.swap` -> final name, recovery finishes or discards a half-done swap), and the
  first dirty offset is checkpointed in `cleaner-offset-checkpoint`.

A segment the cleaner would not change is not rewritten. v0/v1 messages are copied as they are.
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from oncelog.core import compaction as cp
from oncelog.core.txn.partition import AbortedTxn, AbortedTxnIndex
from oncelog.protocol import compression
from oncelog.protocol import records as rec
from oncelog.protocol.errors import KafkaProtocolError
from oncelog.protocol.records.batch import store_crc
from oncelog.protocol.records.control import ABORT, COMMIT, control_type
from oncelog.storage import failpoints as fp
from oncelog.storage.durable import replace_file
from oncelog.storage.fence import Busy, Fenced
from oncelog.storage.segment import CLEANED, Segment, swap_names

if TYPE_CHECKING:
    from oncelog.storage.partition import Partition

log = logging.getLogger(__name__)

CHECKPOINT = "cleaner-offset-checkpoint"
DEFAULT_DEDUPE_BUFFER_SIZE = 128 << 20  # Kafka's log.cleaner.dedupe.buffer.size
_READ_CHUNK = 4 << 20


def read_checkpoint(directory: Path) -> int:
    """The first dirty offset of a partition (0 when never cleaned)."""
    try:
        return int((directory / CHECKPOINT).read_text().strip())
    except (FileNotFoundError, ValueError):
        return 0


def write_checkpoint(directory: Path, offset: int) -> None:
    replace_file(directory / CHECKPOINT, f"{offset}\n")


@dataclass
class CleanedSegment:
    old: Segment
    bytes_before: int
    bytes_after: int
    indexed: Segment | None = None  # the cleaned file's index, built on the cleaner's thread


@dataclass
class Job:
    """One pass over one partition, as `prepare` saw it."""
    partition: Partition
    segments: list[Segment]          # the closed segments, oldest first
    ends: list[int]                  # each one's end offset (the next one's base)
    plan: cp.CleaningPlan
    last_batches: dict[int, cp.LastBatch]
    aborted: list[AbortedTxn]
    now_ms: int
    delete_retention_ms: int
    max_entries: int
    index_interval_bytes: int = 4096
    end_offset: int = -1             # where the map ended: the new first dirty offset
    cleaned: list[CleanedSegment] = field(default_factory=list)
    error: BaseException | None = None
    cancelled: bool = False          # set from another thread: stop at the next batch

    def check_cancelled(self) -> None:
        lease = self.partition.lease
        if self.cancelled or (lease is not None and lease.superseded()):
            # (a newer owner of the partition may be cleaning the same segments: stop writing)
            raise CleaningCancelled(f"{self.partition.topic}-{self.partition.index}")


class CleaningCancelled(Exception):
    """A pass stopped by `LogCleaner.close` (shutdown): its files are discarded."""


def plan(partition: Partition, now_ms: int) -> cp.CleaningPlan | None:
    """The pass due on a compacted partition, if any (cheap: segment metadata only)."""
    plog = partition.log
    cfg = plog.config
    if not cfg.compact or plog.offline or len(plog.segments) < 2:
        return None
    closed = plog.segments[:-1]
    infos = [cp.SegmentInfo(s.base_offset, s.size, s.max_timestamp) for s in closed]
    if partition.cleaner_checkpoint < 0:
        partition.cleaner_checkpoint = read_checkpoint(plog.directory)
    first_dirty = partition.cleaner_checkpoint
    if first_dirty > plog.log_end_offset:  # the log was cut below it: clean it all again
        first_dirty = 0
    first_dirty = max(first_dirty, plog.log_start_offset)
    lso = min(partition.last_stable_offset, plog.high_watermark)
    return cp.plan_cleaning(infos, plog.segments[-1].base_offset, first_dirty, lso, now_ms,
                            min_cleanable_ratio=cfg.min_cleanable_dirty_ratio,
                            min_compaction_lag_ms=cfg.min_compaction_lag_ms,
                            max_compaction_lag_ms=cfg.max_compaction_lag_ms)


def prepare(partition: Partition, now_ms: int, dedupe_buffer_size: int = DEFAULT_DEDUPE_BUFFER_SIZE,
            due: cp.CleaningPlan | None = None) -> Job | None:
    """A pass if one is due (`due`: the plan already made), else None: what it needs of the
    live state, copied (the segments, each producer's last batch, the aborted transactions)."""
    due = due or plan(partition, now_ms)
    if due is None:
        return None
    plog = partition.log
    ends = _ends(plog.segments)
    segments = [s for s, end in zip(plog.segments[:-1], ends) if end <= due.first_uncleanable_offset]
    aborted = [t for s in plog.segments if s.aborted is not None for t in s.aborted.entries()
               if t.first_offset < due.first_uncleanable_offset]
    return Job(partition, segments, ends[:len(segments)], due, partition.cleaner_last_batches(),
               aborted, now_ms, plog.config.delete_retention_ms, max(1, dedupe_buffer_size // cp.ENTRY_COST),
               plog.config.index_interval_bytes)


def _ends(segments: list[Segment]) -> list[int]:
    return [s.base_offset for s in segments[1:]] + [segments[-1].next_offset]


# ------------------------------------------------------------------ the thread's part

def run(job: Job) -> None:
    """Build the offset map and write the cleaned segments (any thread). Errors are kept on the
    job for `commit` to report, and the files written so far are removed."""
    try:
        offsets = cp.OffsetMap(job.max_entries)
        job.end_offset = _build_offset_map(job, offsets)
        txns = cp.CleanedTxns(job.aborted)
        for seg, end in zip(job.segments, job.ends):
            if seg.base_offset >= job.end_offset:
                break
            cleaned = _clean_segment(job, seg, end, offsets, txns)
            if cleaned is not None:
                job.cleaned.append(cleaned)
    except BaseException as e:  # noqa: BLE001 - reported by commit on the appending side
        job.error = e
        discard(job)


def _iter_file(path: Path, size: int) -> Iterable[tuple[rec.BatchHeader, memoryview]]:
    """(header, whole entry bytes) of each entry of a segment file, through a descriptor of its own."""
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = 0
        while pos < size:
            chunk = os.pread(fd, min(_READ_CHUNK, size - pos), pos)
            view = memoryview(chunk)
            last = 0
            for p, h in rec.iter_batches(chunk):
                yield h, view[p:p + h.size]
                last = p + h.size
            if last == 0:  # an entry larger than the chunk
                head = os.pread(fd, rec.LOG_OVERHEAD, pos)
                if len(head) < rec.LOG_OVERHEAD:
                    return
                need = rec.LOG_OVERHEAD + int.from_bytes(head[8:12], "big", signed=True)
                chunk = os.pread(fd, need, pos)
                entries = list(rec.iter_batches(chunk))
                if not entries:
                    return
                yield entries[0][1], memoryview(chunk)[:entries[0][1].size]
                last = entries[0][1].size
            pos += last
    finally:
        os.close(fd)


def _records_section(h: rec.BatchHeader, entry: memoryview) -> memoryview:
    data = entry[rec.BATCH_OVERHEAD:h.size]
    if h.compression and h.records_count:
        return memoryview(compression.decompress(h.compression, data))
    return data


def _build_offset_map(job: Job, offsets: cp.OffsetMap) -> int:
    """Latest offset per key over the dirty segments, whole segments at a time while they fit.
    Records of aborted transactions are left out (Kafka's buildOffsetMap): an aborted write
    must not supersede the committed value before it."""
    end = job.plan.first_dirty_offset
    # only transactions that reach into the dirty range: one whose marker lies below it would
    # never be closed by a marker met here
    txns = cp.CleanedTxns(t for t in job.aborted if t.last_offset >= end)
    for seg, seg_end in zip(job.segments, job.ends):
        if seg_end <= job.plan.first_dirty_offset:
            continue
        pending: dict[bytes, int] = {}
        for h, entry in _iter_file(seg.path, seg.size):
            job.check_cancelled()
            if h.magic < 2 or h.records_count == 0:
                continue
            if h.is_control:
                txns.on_marker(h, _marker_abort(h, cp.scan_records(_records_section(h, entry), h.records_count)))
                continue
            if txns.on_data_batch(h):
                continue
            for r in cp.scan_records(_records_section(h, entry), h.records_count):
                if r.key is not None:
                    pending[cp.key_digest(r.key)] = h.base_offset + r.offset_delta
        new_keys = sum(1 for d in pending if offsets.get(d) < 0)
        if not offsets.room_for(new_keys) and end > job.plan.first_dirty_offset:
            break  # the next pass starts here
        for digest, offset in pending.items():
            offsets.put(digest, offset)
        end = seg_end
    return end


def _clean_segment(job: Job, seg: Segment, seg_end: int, offsets: cp.OffsetMap,
                   txns: cp.CleanedTxns) -> CleanedSegment | None:
    directory = seg.path.parent
    log_cleaned, txn_cleaned = swap_names(directory, seg.base_offset, CLEANED)
    changed = False
    out_fd = os.open(log_cleaned, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    written = 0
    try:
        for h, entry in _iter_file(seg.path, seg.size):
            job.check_cancelled()
            data = _clean_entry(job, h, entry, offsets, txns)
            if data is not entry:
                changed = True
            if data:
                n = fp.log_write(out_fd, data, written)
                if n != len(data):
                    raise OSError(f"short write to {log_cleaned}: {n} of {len(data)} bytes")
                written += n
        retained = [t for t in txns.retained_aborted if seg.base_offset <= t.last_offset < seg_end]
        txns.retained_aborted = [t for t in txns.retained_aborted if t.last_offset >= seg_end]
        if not changed:
            os.close(out_fd)
            out_fd = -1
            log_cleaned.unlink()
            return None
        fp.log_sync(out_fd)
    finally:
        if out_fd >= 0:
            os.close(out_fd)
    index = AbortedTxnIndex()
    for t in retained:
        index.append(t)
    with open(txn_cleaned, "wb") as f:
        f.write(index.encode())
        f.flush()
        os.fsync(f.fileno())
    indexed = Segment(directory, seg.base_offset, job.now_ms, path=log_cleaned)
    try:
        indexed.load_or_rebuild(job.index_interval_bytes, validate=False)
    finally:
        indexed.close()
    return CleanedSegment(seg, seg.size, written, indexed)


def _clean_entry(job: Job, h: rec.BatchHeader, entry: memoryview, offsets: cp.OffsetMap,
                 txns: cp.CleanedTxns) -> memoryview | bytes | bytearray:
    """The entry as the cleaned segment holds it: itself, rewritten, or b"" (gone)."""
    if h.magic < 2:
        return entry
    data = _records_section(h, entry)
    records = cp.scan_records(data, h.records_count)
    abort = _marker_abort(h, records) if h.is_control else None
    verdict = cp.judge_batch(h, records, offsets, txns, job.last_batches, abort, job.now_ms,
                             job.delete_retention_ms)
    if verdict.unchanged:
        return entry
    if not verdict.keep and not verdict.retain_empty:
        return b""
    body, max_ts = cp.rebuild_records(h, data, verdict.keep, verdict.horizon)
    attributes = h.attributes
    if verdict.horizon != cp.NO_HORIZON:
        attributes |= cp.DELETE_HORIZON_FLAG
    base_ts = verdict.horizon if verdict.horizon != cp.NO_HORIZON else h.base_timestamp
    if verdict.keep and h.compression:
        body = compression.compress(h.compression, body)
    elif not verdict.keep:
        attributes &= ~rec.ATTR_COMPRESSION_MASK  # an empty batch is stored uncompressed, as Kafka's
    out = cp.batch_header_bytes(h, len(body), len(verdict.keep), base_ts, max_ts, attributes)
    out += body
    store_crc(out, 0, len(out))
    return out


def _marker_abort(h: rec.BatchHeader, records: list[cp.RecordSpan]) -> bool | None:
    """A control batch's marker: True for ABORT, False for COMMIT, None for an emptied batch or
    another control type."""
    if not records:
        return None
    try:
        kind = control_type(records[0].key)
    except KafkaProtocolError:
        return None
    return {ABORT: True, COMMIT: False}.get(kind)


def discard(job: Job) -> None:
    """Remove every `.cleaned` file the job wrote."""
    for seg in job.segments:
        for p in swap_names(seg.path.parent, seg.base_offset, CLEANED):
            try:
                p.unlink()
            except FileNotFoundError:
                pass


# ------------------------------------------------------------------ back where appends run

def commit(job: Job, now_ms: int) -> int:
    """Swap the cleaned segments in; returns how many. A segment that left the log meanwhile
    (retention, DeleteRecords, truncation) keeps its place, and its cleaned files go."""
    partition = job.partition
    plog = partition.log
    if job.error is not None:
        log.error("%s-%d: cleaning failed, the log is unchanged: %r", partition.topic, partition.index, job.error)
        return 0
    swapped = 0
    before = after = 0
    try:
        with partition.writing():   # a deposed owner swaps nothing in (`storage.fence`)
            for c in job.cleaned:
                new = plog.swap_in(c.old, now_ms, c.indexed)
                if new is None:
                    continue
                partition.segment_swapped(c.old, new)
                swapped += 1
                before += c.bytes_before
                after += c.bytes_after
            if job.end_offset > job.plan.first_dirty_offset and swapped == len(job.cleaned):
                write_checkpoint(plog.directory, job.end_offset)
                partition.cleaner_checkpoint = job.end_offset
    except (Fenced, Busy) as e:
        log.info("%s-%d: cleaned segments not swapped in: %s", partition.topic, partition.index, e)
        if not swapped:
            discard(job)
        return swapped
    log.info("%s-%d: cleaned up to offset %d (dirty ratio %.2f%s): %d segment(s) rewritten, %d -> %d bytes",
             partition.topic, partition.index, job.end_offset, job.plan.dirty_ratio,
             ", max.compaction.lag.ms passed" if job.plan.forced else "", swapped, before, after)
    return swapped


def clean_now(partition: Partition, now_ms: int, dedupe_buffer_size: int = DEFAULT_DEDUPE_BUFFER_SIZE) -> int:
    """One whole pass here and now (tests, tools): segments swapped, 0 if none was due. A
    failure raises (after the log was left unchanged)."""
    job = prepare(partition, now_ms, dedupe_buffer_size)
    if job is None:
        return 0
    run(job)
    if job.error is not None:
        raise job.error
    return commit(job, now_ms)


class LogCleaner:
    """The broker's cleaner: one pass at a time on a thread of its own, started and committed
    from the periodic tick (`storage.topic_registry.maintain`), the filthiest partition first."""

    def __init__(self, enabled: bool = True, dedupe_buffer_size: int = DEFAULT_DEDUPE_BUFFER_SIZE) -> None:
        self.enabled = enabled
        self.dedupe_buffer_size = dedupe_buffer_size
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._running: tuple[Job, concurrent.futures.Future[None]] | None = None
        self.passes = 0

    def tick(self, partitions: Iterable[Partition], now_ms: int) -> None:
        if not self.enabled:
            return
        if self._running is not None:
            done, future = self._running
            if not future.done():
                return
            self._running = None
            commit(done, now_ms)
            self.passes += 1
        plans = [(due, p) for p in partitions if p.log.config.compact for due in (plan(p, now_ms),)
                 if due is not None]
        if not plans:
            return
        due, partition = max(plans, key=lambda dp: dp[0].dirty_ratio)
        job = prepare(partition, now_ms, self.dedupe_buffer_size, due)
        if job is None:
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="log-cleaner")
        self._running = (job, self._pool.submit(run, job))

    def close(self) -> None:
        """Stop a pass in progress at its next batch and throw its work away (the next start
        cleans again)."""
        if self._running is not None:
            self._running[0].cancelled = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._running is not None:
            discard(self._running[0])
            self._running = None
