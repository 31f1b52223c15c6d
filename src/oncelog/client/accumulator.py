"""Record accumulator: per-partition queues of open and closed batches (sans-IO, ms clock passed in).

A batch collects encoded records until it reaches `batch.size`, lingers `linger.ms`, or a flush is
requested. Bytes held by unfinished batches count against `buffer.memory`; `admits` is the one rule
for what fits, and `append` refuses a record that does not (the shell then waits for batches to
complete).
Retried batches are put back in sequence order (`reenqueue`), ahead of batches without one.
"""
from __future__ import annotations

from bisect import bisect_right
from collections import deque
from itertools import accumulate, repeat
from operator import sub
from typing import Any

from oncelog.client.types import TopicPartition
from oncelog.core.sequence import increment, seq_before
from oncelog.protocol.records import (
    ATTR_TRANSACTIONAL,
    BATCH_OVERHEAD,
    HEADER_ROOM,
    RECORD_OVERHEAD,
    build_batch,
    encode_plain_records,
    encode_record,
    record_size_upper_bound,
    rewrite_producer_state,
    seal_batch,
)


class ProducerBatch:
    """Records for one partition, sent and acknowledged as a unit."""

    __slots__ = ("tp", "caller_records", "values", "keys", "headers", "size", "count", "base_ts", "max_ts",
                 "timestamps", "cookies",
                 "created_ms", "encoded", "producer_id", "producer_epoch", "base_sequence",
                 "attempts", "retry_at_ms", "needs_head_of_line", "node", "sent_ms", "compression",
                 "done", "ordinal", "whole", "maybe_written", "last_error")

    def __init__(self, tp: TopicPartition, created_ms: int, compression: int) -> None:
        self.tp = tp
        # a records section encoded by the caller (send_encoded)
        self.caller_records: bytes | bytearray | None = None
        self.values: list = []         # records are kept as given and encoded at drain
        self.keys: list | None = None  # created, with the headers, when a record has either
        self.headers: list | None = None
        self.size = BATCH_OVERHEAD
        self.count = 0
        self.base_ts = 0
        self.max_ts = 0
        self.timestamps: list[int] = []
        self.cookies: list[Any] = []
        self.created_ms = created_ms
        self.encoded: bytes | bytearray | None = None
        self.producer_id = -1
        self.producer_epoch = -1
        self.base_sequence = -1  # -1 until drained by an idempotent partition
        self.attempts = 0
        self.retry_at_ms = 0
        self.needs_head_of_line = False
        self.node = -1
        self.sent_ms = 0
        self.compression = compression
        self.done = False
        self.ordinal = 0  # position among the partition's sequenced batches of this epoch
        self.whole = False  # encoded by the caller (send_encoded): closed, one cookie for all records
        self.maybe_written = False  # an attempt ended without telling whether it was appended
        self.last_error: BaseException | None = None  # what the latest attempt was answered (retried)

    def try_append(self, ts: int, key, value, headers, cookie, batch_size: int) -> bool:
        count = self.count
        if count == 0:
            self.base_ts = ts
        if key is None and not headers:
            # record_size_upper_bound, without the call
            n = RECORD_OVERHEAD if value is None else len(value) + RECORD_OVERHEAD
        else:
            n = record_size_upper_bound(key, value, headers)
            if self.keys is None:
                self.keys = [None] * count
                self.headers = [None] * count
        if count and self.size + n > batch_size:
            return False
        self.values.append(value)
        if self.keys is not None:
            self.keys.append(key)
            self.headers.append(headers)  # type: ignore[union-attr]  # created with the keys
        self.size += n
        self.count = count + 1
        if ts > self.max_ts:
            self.max_ts = ts
        self.timestamps.append(ts)
        self.cookies.append(cookie)
        return True

    def add_plain(self, timestamps, values, cookies, size: int) -> None:
        """Add records without key or headers whose sizes (bounds) sum to `size`; the caller
        has checked that they fit."""
        if not self.count:
            self.base_ts = timestamps[0]
        m = max(timestamps)
        if m > self.max_ts:
            self.max_ts = m
        self.values += values
        self.timestamps += timestamps
        self.cookies += cookies
        if self.keys is not None:
            self.keys += [None] * len(values)
            self.headers += [None] * len(values)  # type: ignore[operator]  # created with the keys
        self.count += len(values)
        self.size += size

    def _records(self, header_room: bool) -> bytes | bytearray:
        """The records section (sizes above are bounds; the encoding is exact)."""
        deltas = list(map(sub, self.timestamps, repeat(self.base_ts)))
        if self.keys is None:
            return encode_plain_records(self.values, deltas, header_room)
        parts = [encode_record(i, d, k, v, h) for i, (d, k, v, h) in enumerate(
            zip(deltas, self.keys, self.values, self.headers))]  # type: ignore[arg-type]  # created with the keys
        return (bytearray().join([HEADER_ROOM, *parts]) if header_room else b"".join(parts))

    @property
    def has_sequence(self) -> bool:
        return self.base_sequence >= 0

    @property
    def last_sequence(self) -> int:
        return increment(self.base_sequence, self.count - 1)

    def set_producer_state(self, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
        self.producer_id, self.producer_epoch, self.base_sequence = producer_id, producer_epoch, base_sequence
        if self.encoded is not None:
            self.encoded = rewrite_producer_state(self.encoded, producer_id, producer_epoch, base_sequence)

    def encode(self) -> bytes | bytearray:
        if self.encoded is None:
            fields: dict[str, int] = dict(base_timestamp=self.base_ts, max_timestamp=self.max_ts,
                          producer_id=self.producer_id, producer_epoch=self.producer_epoch,
                          base_sequence=self.base_sequence)
            if self.compression or self.whole:
                records = self.caller_records if self.whole else self._records(False)
                assert records is not None  # a whole batch is made with its records
                self.encoded = build_batch(records, self.count, compression_codec=self.compression,
                                           **fields, transactional=self.transactional)
            else:   # records laid out behind room for the header: one copy of them, not two
                # with header room the records section is a bytearray
                if self.transactional:
                    fields["attributes"] = ATTR_TRANSACTIONAL
                self.encoded = seal_batch(self._records(True), self.count, **fields)  # type: ignore[arg-type]
            # released once encoded: nothing appends to a batch that is encoded
            self.caller_records = self.values = self.keys = self.headers = None  # type: ignore[assignment]
        return self.encoded

    # a class attribute, not a slot: plain batches pay nothing; TxnProducerBatch says True
    transactional = False

    def __repr__(self) -> str:
        return (f"ProducerBatch({self.tp.topic}-{self.tp.partition}, n={self.count}, "
                f"pid={self.producer_id}/{self.producer_epoch}, seq={self.base_sequence})")


class TxnProducerBatch(ProducerBatch):
    """A batch of a transactional producer: its header says so (the transactional attribute bit),
    which is what makes the partition count it into the producer's open transaction."""
    __slots__ = ()
    transactional = True


class RecordAccumulator:
    def __init__(self, batch_size: int, linger_ms: int, buffer_memory: int, compression: int = 0) -> None:
        self.batch_size = batch_size
        self.linger_ms = linger_ms
        self.buffer_memory = buffer_memory
        self.compression = compression
        self.queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        self.used_bytes = 0
        self.flushing = 0   # flushes in progress: while any waits, nothing lingers
        self.batch_class: type[ProducerBatch] = ProducerBatch   # TxnProducerBatch: transactional

    def append(self, tp: TopicPartition, ts: int, key, value, headers, cookie, now_ms: int
               ) -> tuple[ProducerBatch, bool] | None:
        """Add a record; returns (batch, whether a new batch was opened), or None when
        `buffer.memory` is exhausted (nothing was added)."""
        q = self.queues.get(tp)
        if q is None:
            q = self.queues[tp] = deque()
        last = _open_batch(q)
        if last is not None:
            before = last.size
            if last.try_append(ts, key, value, headers, cookie, self.batch_size):
                self.used_bytes += last.size - before
                return last, False
        if not self.admits(record_size_upper_bound(key, value, headers) + BATCH_OVERHEAD):
            return None
        batch = self.batch_class(tp, now_ms, self.compression)
        batch.try_append(ts, key, value, headers, cookie, self.batch_size)
        self.used_bytes += batch.size
        q.append(batch)
        return batch, True

    def extend(self, tp: TopicPartition, timestamps, keys, values, headers, cookies, sizes,
               now_ms: int) -> bool:
        """Append records of one partition in order, given as columns (`sizes`: each record's
        size bound, already counted against buffer.memory by the caller). True if a batch
        filled."""
        q = self.queues.get(tp)
        if q is None:
            q = self.queues[tp] = deque()
        batch = _open_batch(q)
        if keys.count(None) == len(keys) and not any(headers):
            return self._extend_plain(q, batch, tp, timestamps, values, cookies, sizes, now_ms)
        batch_size = self.batch_size
        filled = False
        used = 0
        for ts, key, value, hdrs, cookie in zip(timestamps, keys, values, headers, cookies):
            if batch is not None:
                before = batch.size
                if batch.try_append(ts, key, value, hdrs, cookie, batch_size):
                    used += batch.size - before
                    continue
                filled = True
            batch = self.batch_class(tp, now_ms, self.compression)
            batch.try_append(ts, key, value, hdrs, cookie, batch_size)
            used += batch.size
            q.append(batch)
        self.used_bytes += used
        return filled or (batch is not None and batch.size >= batch_size)

    def _extend_plain(self, q: deque, batch: ProducerBatch | None, tp: TopicPartition, timestamps,
                      values, cookies, sizes, now_ms: int) -> bool:
        """`extend` for records without key or headers: batch boundaries found on the running
        sum of sizes, records moved by slices (no per-record Python work)."""
        batch_size = self.batch_size
        ends = list(accumulate(sizes))
        n = len(ends)
        i = 0
        filled = False
        while i < n:
            if batch is None:
                batch = self.batch_class(tp, now_ms, self.compression)
                q.append(batch)
                self.used_bytes += BATCH_OVERHEAD
            start = ends[i - 1] if i else 0
            j = bisect_right(ends, start + batch_size - batch.size, i)
            if j == i:
                if batch.count:
                    batch = None
                    filled = True
                    continue
                j = i + 1   # an empty batch takes a record of any size
            batch.add_plain(timestamps[i:j], values[i:j], cookies[i:j], ends[j - 1] - start)
            self.used_bytes += ends[j - 1] - start
            i = j
        return filled or (batch is not None and batch.size >= batch_size)

    def append_encoded(self, tp: TopicPartition, records, count: int, base_ts: int, max_ts: int,
                       cookie, now_ms: int, admitted: bool = False) -> ProducerBatch | None:
        """Queue a records section the caller encoded (offset deltas 0..count-1) as its own
        batch, behind the partition's queued records; None when `buffer.memory` is exhausted."""
        size = BATCH_OVERHEAD + len(records)
        if not admitted and not self.admits(size):
            return None
        batch = self.batch_class(tp, now_ms, self.compression)
        batch.caller_records = records
        batch.size, batch.count, batch.base_ts, batch.max_ts = size, count, base_ts, max_ts
        batch.cookies = [cookie]
        batch.whole = True
        self.queues.setdefault(tp, deque()).append(batch)
        self.used_bytes += size
        return batch

    def release(self, batch: ProducerBatch) -> None:
        self.used_bytes -= batch.size

    def admits(self, size: int, pending: int = 0) -> bool:
        """Whether `size` more bytes fit in `buffer.memory`, with `pending` bytes admitted but not
        appended yet. Into an empty buffer anything fits (a record larger than buffer.memory
        would otherwise wait forever)."""
        used = self.used_bytes + pending
        return used + size <= self.buffer_memory or used <= 0

    def is_sendable(self, batch: ProducerBatch, q: deque, now_ms: int) -> bool:
        """Full, lingered long enough, flushing, a retry whose backoff passed, or not the last."""
        if batch.attempts:
            return now_ms >= batch.retry_at_ms
        return (len(q) > 1 or batch.size >= self.batch_size or batch.whole or self.flushing > 0
                or now_ms - batch.created_ms >= self.linger_ms)

    def next_ready_ms(self, batch: ProducerBatch) -> int:
        if batch.attempts:
            return batch.retry_at_ms
        return batch.created_ms + self.linger_ms

    def reenqueue(self, batch: ProducerBatch) -> None:
        """Put a failed batch back so that the queue stays ordered by sequence."""
        q = self.queues.setdefault(batch.tp, deque())
        if not batch.has_sequence:
            q.appendleft(batch)
            return
        i = 0
        for i, other in enumerate(q):
            if not other.has_sequence or seq_before(batch.base_sequence, other.base_sequence):
                q.insert(i, batch)
                return
        q.append(batch)

    def has_unsent(self) -> bool:
        return any(self.queues.values())


def _open_batch(q: deque) -> ProducerBatch | None:
    """The partition's last batch if records may still join it (not drained, not caller-encoded)."""
    last = q[-1] if q else None
    if last is not None and last.encoded is None and last.base_sequence < 0 and not last.whole:
        return last
    return None

