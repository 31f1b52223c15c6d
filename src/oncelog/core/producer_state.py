"""Per-partition producer state: which idempotent batches were appended, in packed arrays.

Sans-IO: time comes in as integer milliseconds; the caller (storage.partition) owns the log.

Two modes, chosen per topic (DESIGN.md "Broker rules"):
- window (KIP-1269): the last N batches of each producer are retained; a batch equal to one of
  them is a duplicate answered with its original offset; anything else must follow the latest.
- range (KIP-758): only the latest batch is retained; a batch lying wholly within
  `max_in_flight_sequence_number` sequences at or below the latest, counting wraparound, is a
  duplicate, answered with its offset when it is the latest batch (or the log tail has it), else
  DUPLICATE_SEQUENCE_NUMBER.

Validation (`check`) never mutates; `commit` applies a checked batch after the log took it, as
Kafka's prepareUpdate/update split (KAFKA-6683).

Layout: a struct of arrays over all producers of the partition, one slot per producer, plus an
open-addressing hash table (pid -> slot) in an array. Retained batches live in four more arrays at
`slot * stride` as a ring of `stride` entries (stride = window, or 1 in range mode). Per producer:
pid 8 + epoch 2 + last update 8 + ring head/count 4 + ~8 of hash table; per retained batch:
first seq 4 + last seq 4 + base offset 8 + timestamp 8. No Python object per producer or batch,
so a million producers cost what the arrays cost (see bench/producer_state_memory.py).

Bounded work (DESIGN.md): the hash table's home slots come from a keyed mixer whose key storage
draws at random for each partition (and passes in, as it passes the clock), so no client can choose
producer ids that pile up on one probe chain. A partition tracks at most
`producer.state.max.producers.per.partition` producers: a new one beyond that evicts the least
recently updated of a bounded scan (Redpanda evicts its LRU producer too, whose next batch then
fails; here the evicted producer is remembered like an expired one and restored from the log).

Producers whose state left the table (expiry, eviction) while their batches may still be in the
log are remembered (`pid_index.ExpiredProducers`: the offset of each batch they retained), so
that storage can restore one with a read of its batches' headers when it comes back, and a
producer id never seen costs no read at all. Beyond
`producer.state.max.remembered.producers.per.partition` the oldest are forgotten and the
partition's producer-state start offset (`state_start`) rises above what they had written: an
UNKNOWN_PRODUCER_ID answer carries at least that as its log start offset, so the forgotten
producer's client resets instead of reporting data loss.
"""
from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from oncelog.core.pid_index import ExpiredProducers, PidIndex
from oncelog.core.producer_epoch import marker_error
from oncelog.core.sequence import distance_below, increment, seq_before
from oncelog.protocol.errors import ErrorCode

WINDOW = "window"
RANGE = "range"
MODES = (WINDOW, RANGE)
MIN_BATCHES_TO_RETAIN = 5
MAX_BATCHES_TO_RETAIN = 1000  # ring head/count are uint16; 1000 is far beyond any useful window
DEFAULT_MAX_IN_FLIGHT_SEQUENCES = 10_000_000
MAX_IN_FLIGHT_SEQUENCES = 2**30  # KIP-758: "below" and "ahead" ranges must not overlap
DEFAULT_EXPIRATION_MS = 86_400_000
DEFAULT_EXPIRED_LOOKUP_OFFSETS = 10_000
MAX_LOOKUP_OFFSETS = 2**30 - 1  # a lookup spans fewer than 2**30 offsets: no wrapped sequence can match
DEFAULT_MAX_PRODUCERS = 100_000
DEFAULT_MAX_REMEMBERED = 100_000
MAX_MAX_PRODUCERS = 2**31 - 1  # slots are int32 in the hash table
EVICTION_SCAN = 64  # slots compared to pick the least recently updated producer at the cap

# check() outcomes
APPEND = 0     # in sequence: append, then commit
DUPLICATE = 1  # a retained batch: answer its offset, append nothing
LOOKUP = 2     # an older duplicate: its offset may be in the log tail; else answer `error`
REFUSE = 3     # answer `error`, append nothing

# duplicate kinds (metrics labels)
DUP_LATEST = "latest"      # the producer's latest batch, the usual retry
DUP_WINDOW = "window"      # an older retained batch
DUP_TAIL = "tail"          # found by the bounded log-tail lookup
DUP_SEQUENCE = "sequence"  # range mode, offset unknown: DUPLICATE_SEQUENCE_NUMBER


@dataclass(frozen=True, slots=True)
class ProducerStateConfig:
    dedup_mode: str = WINDOW
    batches_to_retain: int = MIN_BATCHES_TO_RETAIN
    max_in_flight_sequence_number: int = DEFAULT_MAX_IN_FLIGHT_SEQUENCES
    expiration_ms: int = DEFAULT_EXPIRATION_MS
    duplicate_lookup_offsets: int = 0  # how far below the retained batches a tail scan may look
    # how far below an expired producer's newest batch the log is read to restore its window
    expired_lookup_offsets: int = DEFAULT_EXPIRED_LOOKUP_OFFSETS
    max_producers: int = DEFAULT_MAX_PRODUCERS  # producers tracked per partition
    max_remembered: int = DEFAULT_MAX_REMEMBERED  # expired/evicted producers remembered per partition

    def __post_init__(self) -> None:
        if self.dedup_mode not in MODES:
            raise ValueError(f"producer.state.dedup.mode must be one of {MODES}, not {self.dedup_mode!r}")
        if not MIN_BATCHES_TO_RETAIN <= self.batches_to_retain <= MAX_BATCHES_TO_RETAIN:
            raise ValueError(f"producer.state.batches.to.retain must be in [{MIN_BATCHES_TO_RETAIN}, "
                             f"{MAX_BATCHES_TO_RETAIN}], not {self.batches_to_retain}")
        if not 1 <= self.max_in_flight_sequence_number <= MAX_IN_FLIGHT_SEQUENCES:
            raise ValueError("max.in.flight.sequence.number.per.connection must be in [1, 2**30]")
        if self.expiration_ms < 1:
            raise ValueError("producer.id.expiration.ms must be at least 1")
        if not 0 <= self.duplicate_lookup_offsets <= MAX_LOOKUP_OFFSETS:
            raise ValueError("producer.state.duplicate.lookup.offsets must be in [0, 2**30)")
        if not 0 <= self.expired_lookup_offsets <= MAX_LOOKUP_OFFSETS:
            raise ValueError("producer.state.expired.lookup.offsets must be in [0, 2**30)")
        if not 1 <= self.max_producers <= MAX_MAX_PRODUCERS:
            raise ValueError(f"producer.state.max.producers.per.partition must be in [1, {MAX_MAX_PRODUCERS}]")
        if not 0 <= self.max_remembered <= MAX_MAX_PRODUCERS:
            raise ValueError("producer.state.max.remembered.producers.per.partition must be in "
                             f"[0, {MAX_MAX_PRODUCERS}]")

    @property
    def stride(self) -> int:
        return 1 if self.dedup_mode == RANGE else self.batches_to_retain

    @classmethod
    def from_topic_config(cls, config: Mapping[str, Any]) -> ProducerStateConfig:
        """From topic configs under their Kafka names (`core.topic_config.effective_topic_config`
        plus the broker's `producer.id.expiration.ms`); names it does not own are ignored, missing
        ones keep the defaults."""
        values: dict[str, Any] = {}
        for field_name, kafka_name in _TOPIC_CONFIG_NAMES.items():
            value = config.get(kafka_name)
            if value is not None:
                values[field_name] = str(value).lower() if field_name == "dedup_mode" else int(value)
        return cls(**values)


_TOPIC_CONFIG_NAMES = {
    "dedup_mode": "producer.state.dedup.mode",
    "batches_to_retain": "producer.state.batches.to.retain",
    "max_in_flight_sequence_number": "max.in.flight.sequence.number.per.connection",
    "expiration_ms": "producer.id.expiration.ms",
    "duplicate_lookup_offsets": "producer.state.duplicate.lookup.offsets",
    "expired_lookup_offsets": "producer.state.expired.lookup.offsets",
    "max_producers": "producer.state.max.producers.per.partition",
    "max_remembered": "producer.state.max.remembered.producers.per.partition",
}


class Check(NamedTuple):
    """The verdict on one batch; carries what `commit` needs."""
    kind: int
    producer_id: int
    epoch: int
    first_seq: int
    last_seq: int
    error: int = 0                # REFUSE: the answer; LOOKUP: the answer when the scan misses
    message: str | None = None
    base_offset: int = -1         # DUPLICATE: the original; LOOKUP: scan strictly below this offset
    timestamp: int = -1           # DUPLICATE: the original answer's timestamp
    duplicate_kind: str | None = None


class ProducerSnapshotColumns(NamedTuple):
    """The whole state as plain arrays (what snapshots store); batch arrays use `stride`.
    The expired_* columns are the remembered producers (`expired_stride` base offsets each),
    `state_start` the producer-state start offset (see ProducerStateManager.state_start)."""
    stride: int
    pid: array[int]
    epoch: array[int]
    updated: array[int]
    head: array[int]
    count: array[int]  # type: ignore[assignment]  # shadows tuple.count; the snapshot's column name
    first: array[int]
    last: array[int]
    offset: array[int]
    timestamp: array[int]
    expired_stride: int = 1
    expired_pid: array[int] | None = None
    expired_count: array[int] | None = None
    expired_end: array[int] | None = None
    expired_offsets: array[int] | None = None
    state_start: int = 0
    # v4: each producer's last coordinator epoch (-1 none), and the partition's open transactions
    # (producer id, first offset) -- the latter filled in by storage from `core.txn.PartitionTxns`
    coordinator_epoch: array[int] | None = None
    txn_pid: array[int] | None = None
    txn_first: array[int] | None = None


class ProducerEntry(NamedTuple):
    """One producer, materialised for inspection (DescribeProducers, tests)."""
    producer_id: int
    epoch: int
    last_sequence: int
    last_timestamp: int
    batches: tuple[tuple[int, int, int, int], ...]  # (first_seq, last_seq, base_offset, timestamp), oldest first
    coordinator_epoch: int = -1


_EXPIRED_KEY_SALT = 0x5DEECE66D  # the remembered set's table gets a key of its own


class ProducerStateManager:
    def __init__(self, config: ProducerStateConfig | None = None, *, hash_key: int) -> None:
        """`hash_key`: 64 random bits from the caller (storage draws them per partition), mixed
        into every producer id before it is hashed."""
        self.config = config or ProducerStateConfig()
        self._key = hash_key
        self._stride = self.config.stride
        self._index = PidIndex(self._key)
        self._epoch = array("h")
        self._coord = array("i")    # last coordinator epoch seen in a marker (-1: none)
        self._updated = array("q")
        self._head = array("H")
        self._count = array("H")
        self._first = array("i")
        self._last = array("i")
        self._offset = array("q")
        self._ts = array("q")
        self.expired = self._new_expired(self._stride)
        self._hand = 0         # where the next eviction scan starts
        self._log_start = 0    # storage's log start offset: producers wholly below it are not remembered
        self.evictions = 0     # producers evicted at the cap (metrics)

    def _new_expired(self, stride: int) -> ExpiredProducers:
        return ExpiredProducers(self._key ^ _EXPIRED_KEY_SALT, self.config.max_remembered, stride)

    # ------------------------------------------------------------ configuration
    @property
    def mode(self) -> str:
        return self.config.dedup_mode

    @property
    def stride(self) -> int:
        return self._stride

    @property
    def state_start(self) -> int:
        """The producer-state start offset: every producer forgotten for room (see
        ExpiredProducers) wrote only below it, so an UNKNOWN_PRODUCER_ID answer reports a log start
        offset of at least this -- above anything such a producer had acknowledged."""
        return self.expired.watermark + 1

    def reconfigure(self, config: ProducerStateConfig) -> None:
        """Take a new config at once; a new window re-lays the rings keeping the newest batches,
        a lower producer cap evicts the least recently updated producers."""
        self.config = config
        self.expired.capacity = config.max_remembered
        if config.stride != self._stride:
            self._relayout(config.stride)
        self.expired.relayout(config.stride)
        self._evict_down_to(config.max_producers)
        self.expired.shed()

    def _relayout(self, stride: int) -> None:
        old = self._stride
        n = len(self._index)
        first, last = array("i", bytes(4 * n * stride)), array("i", bytes(4 * n * stride))
        offset, ts = array("q", bytes(8 * n * stride)), array("q", bytes(8 * n * stride))
        for s in range(n):
            count, head, base = self._count[s], self._head[s], s * old
            keep = min(count, stride)
            for k in range(keep):
                src = base + (head + count - keep + k) % old
                dst = s * stride + k
                first[dst], last[dst] = self._first[src], self._last[src]
                offset[dst], ts[dst] = self._offset[src], self._ts[src]
            self._head[s] = 0
            self._count[s] = keep
        self._first, self._last, self._offset, self._ts = first, last, offset, ts
        self._stride = stride

    # ------------------------------------------------------------ slots
    def _find(self, pid: int) -> int:
        return self._index.find(pid)

    def _new_slot(self, pid: int, epoch: int) -> int:
        if len(self._index) >= self.config.max_producers:
            self._evict_one()
        s = self._index.add(pid)
        self._epoch.append(epoch)
        self._coord.append(-1)
        self._updated.append(0)
        self._head.append(0)
        self._count.append(0)
        zeros_i = array("i", bytes(4 * self._stride))
        zeros_q = array("q", bytes(8 * self._stride))
        self._first.extend(zeros_i)
        self._last.extend(zeros_i)
        self._offset.extend(zeros_q)
        self._ts.extend(zeros_q)
        return s

    def _remove_slot(self, s: int) -> None:
        """Swap-remove: the last slot moves into `s` so the arrays stay dense."""
        last = self._index.remove(s)
        stride = self._stride
        if s != last:
            for arr in (self._epoch, self._coord, self._updated, self._head, self._count):
                arr[s] = arr[last]
            a, b = s * stride, last * stride
            for arr in (self._first, self._last, self._offset, self._ts):
                arr[a:a + stride] = arr[b:b + stride]
        for arr in (self._epoch, self._coord, self._updated, self._head, self._count):
            arr.pop()
        for arr in (self._first, self._last, self._offset, self._ts):
            del arr[last * stride:]

    def _retire(self, s: int) -> None:
        """Remember where slot `s`'s batches are before its state goes (expiry, eviction)."""
        count = self._count[s]
        if not count:
            return
        stride, head, offset = self._stride, self._head[s], self._offset
        base = s * stride
        offsets = [offset[base + (head + k) % stride] for k in range(count)]
        newest = base + (head + count - 1) % stride
        # an idempotent batch's records are numbered like its sequences: its last offset follows
        end = offsets[-1] + distance_below(self._last[newest], self._first[newest])
        if end >= self._log_start:
            self.expired.add(self._index.pids[s], offsets, end)

    def _retire_slots(self, slots: list[int]) -> None:
        for s in slots:
            self._retire(s)
        for s in sorted(slots, reverse=True):  # highest first: swap-remove never moves a pending slot
            self._remove_slot(s)
        self.expired.shed()

    def _evict_one(self) -> None:
        """At the producer cap: move the least recently updated of EVICTION_SCAN slots, scanned
        from a hand that goes round the table, to the remembered set (a clock-style approximate
        LRU: no request scans all producers). Its next batch restores it from the log."""
        n, updated = len(self._index), self._updated
        start = self._hand % n
        stop = start + min(n, EVICTION_SCAN)
        window = updated[start:stop] if stop <= n else updated[start:] + updated[:stop - n]
        victim = (start + window.index(min(window))) % n
        self._hand = stop
        self.evictions += 1
        self._retire_slots([victim])

    def _evict_down_to(self, limit: int) -> None:
        """Evict the least recently updated producers beyond `limit` (a lowered cap, a snapshot
        holding more): a sort, once per config change or load, not per request."""
        excess = len(self._index) - limit
        if excess > 0:
            self.evictions += excess
            self._retire_slots(sorted(range(len(self._index)), key=self._updated.__getitem__)[:excess])

    # ------------------------------------------------------------ validation
    def check(self, producer_id: int, epoch: int, first_seq: int, last_seq: int) -> Check:
        """Decide what to do with a client batch. Never mutates."""
        s = self._find(producer_id)
        if s < 0:
            if first_seq != 0:
                # The seed's rule: state lost (expiry, deleted log) is not data loss by itself;
                # the client compares our log start offset (at least state_start) with its last
                # acknowledged offset.
                return Check(REFUSE, producer_id, epoch, first_seq, last_seq, ErrorCode.UNKNOWN_PRODUCER_ID,
                             f"no state for producer {producer_id} and sequence {first_seq} is not 0")
            return Check(APPEND, producer_id, epoch, first_seq, last_seq)
        current = self._epoch[s]
        if epoch < current:
            return Check(REFUSE, producer_id, epoch, first_seq, last_seq, ErrorCode.INVALID_PRODUCER_EPOCH,
                         f"epoch {epoch} is older than the current epoch {current}")
        count = self._count[s]
        if epoch > current or count == 0:
            if first_seq != 0:
                if epoch > current:
                    return Check(REFUSE, producer_id, epoch, first_seq, last_seq,
                                 ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                 f"a new epoch {epoch} must start at sequence 0, not {first_seq}")
                return Check(REFUSE, producer_id, epoch, first_seq, last_seq, ErrorCode.UNKNOWN_PRODUCER_ID,
                             f"no batches known for producer {producer_id} and sequence {first_seq} is not 0")
            return Check(APPEND, producer_id, epoch, first_seq, last_seq)
        stride, head = self._stride, self._head[s]
        base = s * stride
        firsts, lasts = self._first, self._last
        for k in range(count - 1, -1, -1):
            p = base + (head + k) % stride
            if firsts[p] == first_seq and lasts[p] == last_seq:
                return Check(DUPLICATE, producer_id, epoch, first_seq, last_seq,
                             base_offset=self._offset[p], timestamp=self._ts[p],
                             duplicate_kind=DUP_LATEST if k == count - 1 else DUP_WINDOW)
        newest = base + (head + count - 1) % stride
        latest_last = lasts[newest]
        if first_seq == increment(latest_last, 1):
            return Check(APPEND, producer_id, epoch, first_seq, last_seq)
        if self.config.dedup_mode == RANGE:
            below = distance_below(latest_last, first_seq)
            if below < self.config.max_in_flight_sequence_number and distance_below(latest_last, last_seq) <= below:
                return Check(LOOKUP, producer_id, epoch, first_seq, last_seq,
                             ErrorCode.DUPLICATE_SEQUENCE_NUMBER,
                             f"sequences {first_seq}..{last_seq} are at most {below} below the latest "
                             f"{latest_last}: already appended",
                             base_offset=self._offset[newest])
            return Check(REFUSE, producer_id, epoch, first_seq, last_seq,
                         ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                         f"expected sequence {increment(latest_last, 1)}, got {first_seq}"
                         f" (duplicates are recognised up to "
                         f"{self.config.max_in_flight_sequence_number} below {latest_last})")
        oldest = base + head
        oldest_first = firsts[oldest]
        older = distance_below(oldest_first, last_seq)
        if seq_before(last_seq, oldest_first) and distance_below(oldest_first, first_seq) >= older:
            return Check(LOOKUP, producer_id, epoch, first_seq, last_seq,
                         ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                         f"sequences {first_seq}..{last_seq} are older than the {count} retained "
                         f"batches (from sequence {oldest_first})",
                         base_offset=self._offset[oldest])
        return Check(REFUSE, producer_id, epoch, first_seq, last_seq, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                     f"expected sequence {increment(latest_last, 1)}, got {first_seq}..{last_seq}")

    # ------------------------------------------------------------ updates
    def commit(self, check: Check, base_offset: int, timestamp: int, now_ms: int) -> None:
        """Record a batch the log has taken (`check.kind == APPEND`)."""
        self.record(check.producer_id, check.epoch, check.first_seq, check.last_seq, base_offset,
                    timestamp, now_ms)

    def record(self, producer_id: int, epoch: int, first_seq: int, last_seq: int, base_offset: int,
               timestamp: int, updated_ms: int) -> None:
        """Record a batch without validation (commit, restore, and replay of the log at
        recovery). A new producer at the cap evicts another (see _evict_one)."""
        s = self._find(producer_id)
        if s < 0:
            if len(self.expired):
                self.expired.pop(producer_id)
            s = self._new_slot(producer_id, epoch)
        elif self._epoch[s] != epoch:
            # A new epoch starts a new sequence space; older batches can no longer match.
            self._epoch[s] = epoch
            self._head[s] = 0
            self._count[s] = 0
        stride, head, count = self._stride, self._head[s], self._count[s]
        if count < stride:
            p = s * stride + (head + count) % stride
            self._count[s] = count + 1
        else:
            p = s * stride + head
            self._head[s] = (head + 1) % stride
        self._first[p] = first_seq
        self._last[p] = last_seq
        self._offset[p] = base_offset
        self._ts[p] = timestamp
        if updated_ms > self._updated[s]:
            self._updated[s] = updated_ms

    # ------------------------------------------------------------ transaction markers
    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int, transaction_version: int = 0,
                     transaction_open: bool = False) -> tuple[int, str | None]:
        """Whether a COMMIT/ABORT marker may be appended (`producer_epoch.marker_error`; whether
        the producer has a transaction open here is the partition's to say). Never mutates."""
        s = self._find(producer_id)
        if s < 0:
            return ErrorCode.NONE, None
        return marker_error(producer_id, self._epoch[s], self._coord[s], epoch, coordinator_epoch,
                            transaction_version, transaction_open)

    def record_marker(self, producer_id: int, epoch: int, coordinator_epoch: int, updated_ms: int) -> None:
        """A checked marker is in the log (or replayed): the producer takes the marker's epoch (a
        higher one, from a fence, starts a new sequence space) and coordinator epoch."""
        s = self._find(producer_id)
        if s < 0:
            if len(self.expired):
                self.expired.pop(producer_id)
            s = self._new_slot(producer_id, epoch)
        elif epoch > self._epoch[s]:
            self._epoch[s] = epoch
            self._head[s] = 0
            self._count[s] = 0
        if coordinator_epoch > self._coord[s]:
            self._coord[s] = coordinator_epoch
        if updated_ms > self._updated[s]:
            self._updated[s] = updated_ms

    def epoch_of(self, producer_id: int) -> int:
        s = self._find(producer_id)
        return -1 if s < 0 else self._epoch[s]

    def remove_expired(self, now_ms: int, keep: Callable[[int], bool] | None = None) -> int:
        """Forget producers idle for producer.id.expiration.ms, remembering where their batches
        are; returns how many. `keep(pid)`: never expire it (a producer with an open transaction)."""
        cutoff = now_ms - self.config.expiration_ms
        expired = [s for s, t in enumerate(self._updated) if t <= cutoff]
        if keep is not None and expired:
            pids = self._index.pids
            expired = [s for s in expired if not keep(pids[s])]
        self._retire_slots(expired)
        return len(expired)

    def forget_expired_before(self, log_start_offset: int) -> None:
        """The log now starts at `log_start_offset`: producers whose newest batch lies wholly
        below it need no restore (and are not remembered from now on)."""
        self._log_start = log_start_offset
        self.expired.forget_outside(log_start_offset)

    def clear(self) -> None:
        """Empty, keeping the key, the log start and the monotonic counts."""
        log_start, evictions, forgotten = self._log_start, self.evictions, self.expired.forgotten
        self.__init__(self.config, hash_key=self._key)  # type: ignore[misc]  # the class is final in practice
        self._log_start, self.evictions, self.expired.forgotten = log_start, evictions, forgotten

    # ------------------------------------------------------------ inspection
    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, producer_id: int) -> bool:
        return self._find(producer_id) >= 0

    def entry(self, producer_id: int) -> ProducerEntry | None:
        s = self._find(producer_id)
        return None if s < 0 else self._entry(s)

    def _entry(self, s: int) -> ProducerEntry:
        stride, head, count = self._stride, self._head[s], self._count[s]
        batches = []
        for k in range(count):
            p = s * stride + (head + k) % stride
            batches.append((self._first[p], self._last[p], self._offset[p], self._ts[p]))
        return ProducerEntry(self._index.pids[s], self._epoch[s], batches[-1][1] if batches else -1,
                             self._updated[s], tuple(batches), self._coord[s])

    def entries(self) -> Iterator[ProducerEntry]:
        for s in range(len(self._index)):
            yield self._entry(s)

    def probe_length(self, producer_id: int) -> int:
        return self._index.probe_length(producer_id)

    def memory_bytes(self) -> int:
        """Bytes held by the arrays (what the state costs; the manager object itself is constant)."""
        return self._index.memory_bytes() + self.expired.memory_bytes() + sum(sys.getsizeof(a) for a in (
            self._epoch, self._coord, self._updated, self._head, self._count,
            self._first, self._last, self._offset, self._ts))

    # ------------------------------------------------------------ snapshots
    def columns(self) -> ProducerSnapshotColumns:
        pid, count, end, offsets = self.expired.columns()
        return ProducerSnapshotColumns(self._stride, self._index.pids, self._epoch, self._updated, self._head,
                                       self._count, self._first, self._last, self._offset, self._ts,
                                       self.expired.stride, pid, count, end, offsets, self.state_start,
                                       self._coord)

    def load_columns(self, cols: ProducerSnapshotColumns, now_ms: int | None = None,
                     keep: Callable[[int], bool] | None = None) -> None:
        """Replace the state with snapshot columns; re-lays them if the window changed since,
        drops producers already expired at `now_ms` (remembering them as expired) and evicts
        down to the producer cap."""
        n = len(cols.pid)
        for arr, per in ((cols.epoch, 1), (cols.updated, 1), (cols.head, 1), (cols.count, 1),
                         (cols.first, cols.stride), (cols.last, cols.stride), (cols.offset, cols.stride),
                         (cols.timestamp, cols.stride)):
            if len(arr) != n * per:
                raise ValueError("snapshot columns disagree in length")
        if cols.coordinator_epoch is not None and len(cols.coordinator_epoch) != n:
            raise ValueError("snapshot columns disagree in length")
        if any(c > cols.stride for c in cols.count) or any(h >= cols.stride for h in cols.head):
            raise ValueError("snapshot ring positions out of range")
        index = PidIndex(self._key, array("q", cols.pid))  # raises on a producer listed twice
        expired = self._new_expired(cols.expired_stride)
        if cols.expired_pid is not None:
            # the expired_* columns come together (ProducerColumns' readers set all or none)
            assert cols.expired_count is not None and cols.expired_end is not None
            assert cols.expired_offsets is not None
            expired.load(cols.expired_stride, cols.expired_pid, cols.expired_count, cols.expired_end,
                         cols.expired_offsets, cols.state_start - 1)
            live = [p for p, _r in expired.items() if index.find(p) >= 0]
            for p in live:  # tracked and remembered at once: the tracked state wins
                expired.pop(p)
        else:
            expired.watermark = cols.state_start - 1
        self._stride = cols.stride
        self._index = index
        self._epoch, self._updated = array("h", cols.epoch), array("q", cols.updated)
        self._coord = array("i", cols.coordinator_epoch) if cols.coordinator_epoch is not None \
            else array("i", [-1]) * n
        self._head, self._count = array("H", cols.head), array("H", cols.count)
        self._first, self._last = array("i", cols.first), array("i", cols.last)
        self._offset, self._ts = array("q", cols.offset), array("q", cols.timestamp)
        self.expired = expired
        self._hand = 0
        if self.config.stride != self._stride:
            self._relayout(self.config.stride)
        expired.relayout(self.config.stride)
        expired.forget_outside(self._log_start)
        if now_ms is not None:
            self.remove_expired(now_ms, keep)
        self._evict_down_to(self.config.max_producers)
        expired.shed()
