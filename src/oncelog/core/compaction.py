"""Log compaction's decisions, sans-IO (Kafka's LogCleaner, LogCleanerManager and
CleanedTransactionMetadata): when a partition is due for cleaning, which range, and what of each
batch survives. Storage (`storage.cleaner`) reads the segments, asks these functions, writes the
result and swaps it in.

What survives a cleaning, as in Kafka:
- a record with a key survives if no later record of the log (up to the end of the cleaned range)
  has the same key; a record without a key never survives (it is refused at produce anyway);
- a tombstone (null value) survives until its batch's delete horizon: the first cleaning that
  keeps it stamps the batch with `now + delete.retention.ms` (KIP-534: attribute bit 0x40, the
  horizon in the base timestamp), and the first cleaning after that time drops it;
- records of aborted transactions are dropped; a transaction marker stays while records of its
  transaction remain, then until its own delete horizon;
- the batch holding the last sequence of each producer the partition tracks (or its last marker,
  when that is its latest entry) stays, emptied of records if need be, so that its
  (epoch, sequence) state is rebuilt from the log after a restart: an idempotent producer's retry
  of that batch is still a duplicate, never OutOfOrderSequence;
- offsets never change; a rewritten batch keeps its base offset, last offset delta, producer id,
  epoch, base sequence and leader epoch (offset gaps inside and between batches are normal).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from oncelog.core.txn.partition import AbortedTxn
from oncelog.protocol.records import BATCH_HEADER, BATCH_OVERHEAD, BatchHeader, decode_varint, encode_varint

DELETE_HORIZON_FLAG = 0x40  # KIP-534: the batch's base timestamp is its delete horizon
NO_HORIZON = -1
ENTRY_COST = 128  # bytes an offset-map entry costs (a dict slot, a 16-byte digest, an int)


def delete_horizon(h: BatchHeader) -> int:
    """The batch's delete horizon (ms), or NO_HORIZON."""
    return h.base_timestamp if h.attributes & DELETE_HORIZON_FLAG else NO_HORIZON


def key_digest(key: bytes | memoryview) -> bytes:
    """What the offset map keeps of a key (Kafka keeps an MD5 of it): 16 bytes, whatever its size."""
    return hashlib.blake2b(key, digest_size=16).digest()


class OffsetMap:
    """key digest -> the offset of its latest record in the dirty range, bounded in entries
    (`log.cleaner.dedupe.buffer.size` / ENTRY_COST). It is built over whole segments, and a pass
    rewrites only the segments below the end of that range: a key it lacks has no later record
    in the range, even when the range held no key at all (only aborted transactions and
    markers). Kafka's map may stop inside a segment; its `latestOffset`, advanced over every
    batch read, is that end."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max(1, max_entries)
        self._map: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._map)

    def room_for(self, new_keys: int) -> bool:
        return len(self._map) + new_keys <= self.max_entries

    def put(self, digest: bytes, offset: int) -> None:
        self._map[digest] = offset

    def get(self, digest: bytes) -> int:
        return self._map.get(digest, -1)


# ------------------------------------------------------------------ when and what to clean

class SegmentInfo(NamedTuple):
    base_offset: int
    size: int
    max_timestamp: int  # -1 if unknown (then the segment's file time, given by storage)


class CleaningPlan(NamedTuple):
    first_dirty_offset: int
    first_uncleanable_offset: int
    dirty_ratio: float
    forced: bool  # max.compaction.lag.ms passed


def first_uncleanable_offset(closed: Sequence[SegmentInfo], active_base: int, last_stable_offset: int,
                             now_ms: int, min_compaction_lag_ms: int) -> int:
    """Where cleaning must stop (Kafka's LogCleanerManager.cleanableOffsets): the active segment,
    the first unstable offset (an open transaction's records may still be aborted), and the first
    segment holding a record younger than min.compaction.lag.ms."""
    limit = min(active_base, last_stable_offset)
    if min_compaction_lag_ms > 0:
        for seg in closed:
            if seg.max_timestamp > now_ms - min_compaction_lag_ms:
                limit = min(limit, seg.base_offset)
                break
    return limit


def plan_cleaning(closed: Sequence[SegmentInfo], active_base: int, first_dirty_offset: int,
                  last_stable_offset: int, now_ms: int, *, min_cleanable_ratio: float,
                  min_compaction_lag_ms: int, max_compaction_lag_ms: int) -> CleaningPlan | None:
    """A cleaning of whole closed segments from `first_dirty_offset`, if one is due: the dirty
    bytes' share of the cleanable log reaches min.cleanable.dirty.ratio, or the oldest dirty
    record is older than max.compaction.lag.ms. None when nothing is due."""
    limit = first_uncleanable_offset(closed, active_base, last_stable_offset, now_ms, min_compaction_lag_ms)
    ends = [s.base_offset for s in closed[1:]] + [active_base]
    clean = dirty = 0
    oldest_dirty = None
    for seg, end in zip(closed, ends):
        if end > limit:
            break
        if end <= first_dirty_offset:
            clean += seg.size
        else:
            dirty += seg.size
            if oldest_dirty is None and seg.max_timestamp >= 0:
                oldest_dirty = seg.max_timestamp
    if dirty == 0:
        return None
    ratio = dirty / (clean + dirty)
    forced = oldest_dirty is not None and now_ms - oldest_dirty >= max_compaction_lag_ms
    if ratio < min_cleanable_ratio and not forced:
        return None
    return CleaningPlan(first_dirty_offset, limit, ratio, forced)


# ------------------------------------------------------------------ records of one batch

class RecordSpan(NamedTuple):
    """One record inside a batch's (decompressed) records section."""
    start: int  # its length varint
    end: int
    offset_delta: int
    timestamp_delta: int
    key: memoryview | None
    has_value: bool
    attributes: int  # the position of its attributes byte
    body: int  # where the part after the timestamp delta starts (offset delta onwards)


def scan_records(data: memoryview, count: int) -> list[RecordSpan]:
    """The records of a batch's records section, as spans (nothing copied): what the cleaner
    needs to decide and to copy the kept ones byte for byte."""
    out = []
    pos = 0
    for _ in range(count):
        length, body = decode_varint(data, pos)
        end = body + length
        ts_delta, p = decode_varint(data, body + 1)
        after_ts = p
        off_delta, p = decode_varint(data, p)
        klen, p = decode_varint(data, p)
        key = None
        if klen >= 0:
            key = data[p:p + klen]
            p += klen
        vlen, p = decode_varint(data, p)
        out.append(RecordSpan(pos, end, off_delta, ts_delta, key, vlen >= 0, body, after_ts))
        pos = end
    if pos != len(data):
        raise ValueError(f"records section holds {len(data) - pos} bytes after its {count} records")
    return out


def keyless_records(data: memoryview, count: int) -> list[int]:
    """The indexes of the records without a key in a batch's records section (a compacted topic
    refuses the batch with INVALID_RECORD and names these, as Kafka's LogValidator does)."""
    return [i for i, r in enumerate(scan_records(data, count)) if r.key is None]


# ------------------------------------------------------------------ transactions

class CleanedTxns:
    """Transactions as the cleaner walks the log in offset order (Kafka's
    CleanedTransactionMetadata): batches of aborted transactions are dropped, and a marker may go
    only once no record of its transaction is left (the cleaner met none this pass)."""

    def __init__(self, aborted: Iterable[AbortedTxn]) -> None:
        self._pending = sorted(aborted, key=lambda t: t.first_offset)
        self._pending.reverse()  # popped from the end: smallest first offset first
        self._ongoing_aborted: dict[int, tuple[AbortedTxn, bool]] = {}  # pid -> (txn, records seen)
        self._ongoing_committed: set[int] = set()
        self.retained_aborted: list[AbortedTxn] = []  # index entries of the markers kept

    def _consume_up_to(self, offset: int) -> None:
        while self._pending and self._pending[-1].first_offset <= offset:
            txn = self._pending.pop()
            self._ongoing_aborted.setdefault(txn.producer_id, (txn, False))

    def on_data_batch(self, h: BatchHeader) -> bool:
        """True if the batch belongs to an aborted transaction (its records go)."""
        self._consume_up_to(h.last_offset)
        if not h.is_transactional:
            return False
        ongoing = self._ongoing_aborted.get(h.producer_id)
        if ongoing is not None:
            self._ongoing_aborted[h.producer_id] = (ongoing[0], True)
            return True
        self._ongoing_committed.add(h.producer_id)
        return False

    def on_marker(self, h: BatchHeader, abort: bool | None) -> bool:
        """A control batch (abort: its marker's type, None for an emptied one or another control
        type). True if it may go once its delete horizon has passed. An ABORT marker whose
        transaction still had records this pass stays, and so does its index entry."""
        self._consume_up_to(h.last_offset)
        if abort is None:
            return h.records_count == 0  # an emptied marker was cleaned before
        if abort:
            ongoing = self._ongoing_aborted.pop(h.producer_id, None)
            if ongoing is not None and ongoing[1]:
                self.retained_aborted.append(ongoing[0])
                return False
            return True
        if h.producer_id in self._ongoing_committed:
            self._ongoing_committed.discard(h.producer_id)
            return False
        return True


# ------------------------------------------------------------------ one batch

class LastBatch(NamedTuple):
    """What must survive of a producer the partition tracks: its latest data batch (by base
    offset, -1 if its latest entry is a marker) and its epoch."""
    base_offset: int
    epoch: int


class BatchVerdict(NamedTuple):
    keep: list[RecordSpan]
    retain_empty: bool       # the header stays even if no record does
    horizon: int             # the delete horizon the rewritten batch carries (NO_HORIZON: none)
    unchanged: bool          # copy the batch as it is


def judge_batch(h: BatchHeader, records: list[RecordSpan], offsets: OffsetMap, txns: CleanedTxns,
                last_batches: Mapping[int, LastBatch], marker_abort: bool | None, now_ms: int,
                delete_retention_ms: int) -> BatchVerdict:
    """Kafka's cleanInto filter for one v2 batch."""
    horizon = delete_horizon(h)
    if h.is_control:
        may_go = txns.on_marker(h, marker_abort)
        drop_records = may_go and horizon != NO_HORIZON and horizon <= now_ms
    else:
        may_go = txns.on_data_batch(h)
        drop_records = may_go
    last = last_batches.get(h.producer_id) if h.producer_id >= 0 else None
    if last is None:
        is_last = False
    elif last.base_offset >= 0:
        is_last = h.base_offset == last.base_offset
    else:
        is_last = h.is_control and h.producer_epoch == last.epoch
    if drop_records:
        keep: list[RecordSpan] = []
    elif h.is_control:
        keep = records
    else:
        keep = [r for r in records if _keep_record(h, r, offsets, horizon, now_ms)]
    tombstones = not h.is_control and any(not r.has_value for r in keep)
    if horizon == NO_HORIZON and (tombstones or (h.is_control and may_go and keep)):
        horizon = now_ms + delete_retention_ms
    # an empty batch (emptied by an earlier pass) that is no longer its producer's last goes,
    # as Kafka keeps no empty batch it need not (DELETE_EMPTY); it would hold its marker too
    unchanged = len(keep) == len(records) and horizon == delete_horizon(h) and (bool(keep) or is_last)
    return BatchVerdict(keep, is_last, horizon, unchanged)


def _keep_record(h: BatchHeader, r: RecordSpan, offsets: OffsetMap, horizon: int, now_ms: int) -> bool:
    if r.key is None:
        return False
    if h.base_offset + r.offset_delta < offsets.get(key_digest(r.key)):
        return False
    return r.has_value or horizon == NO_HORIZON or now_ms < horizon


def rebuild_records(h: BatchHeader, data: memoryview, keep: list[RecordSpan], horizon: int
                    ) -> tuple[bytes, int]:
    """The kept records' bytes, and the batch's new max timestamp. Records are copied as they
    are unless the base timestamp moves to a new delete horizon, when each one's timestamp delta
    is rewritten (its timestamp is kept)."""
    base_ts = horizon if horizon != NO_HORIZON else h.base_timestamp
    log_append = h.timestamp_type == 1
    max_ts = -1
    parts: list[bytes | memoryview] = []
    for r in keep:
        ts = h.base_timestamp + r.timestamp_delta
        if not log_append and ts > max_ts:
            max_ts = ts
        if base_ts == h.base_timestamp:
            parts.append(data[r.start:r.end])
        else:
            inner = b"".join((data[r.attributes:r.attributes + 1], encode_varint(ts - base_ts),
                              data[r.body:r.end]))
            parts.append(encode_varint(len(inner)) + inner)
    if log_append or not keep:
        max_ts = h.max_timestamp
    return b"".join(parts), max_ts


def batch_header_bytes(h: BatchHeader, records_len: int, count: int, base_timestamp: int, max_timestamp: int,
                       attributes: int) -> bytearray:
    """A v2 header for a rewritten batch (CRC not yet stored): every producer field, the base
    offset and the last offset delta as they were."""
    buf = bytearray(BATCH_OVERHEAD)
    BATCH_HEADER.pack_into(buf, 0, h.base_offset, BATCH_OVERHEAD - 12 + records_len, h.partition_leader_epoch,
                           2, 0, attributes, h.last_offset_delta, base_timestamp, max_timestamp,
                           h.producer_id, h.producer_epoch, h.base_sequence, count)
    return buf
