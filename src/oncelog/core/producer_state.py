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
"""
from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple

from oncelog.core.sequence import distance_below, increment
from oncelog.protocol.errors import ErrorCode

WINDOW = "window"
RANGE = "range"
MODES = (WINDOW, RANGE)
MIN_BATCHES_TO_RETAIN = 5
MAX_BATCHES_TO_RETAIN = 1000  # ring head/count are uint16; 1000 is far beyond any useful window
DEFAULT_MAX_IN_FLIGHT_SEQUENCES = 10_000_000
MAX_IN_FLIGHT_SEQUENCES = 2**30  # KIP-758: "below" and "ahead" ranges must not overlap
DEFAULT_EXPIRATION_MS = 86_400_000
DEFAULT_EXPIRED_LOOKUP_OFFSETS = 100_000
MAX_EXPIRED_REMEMBERED = 100_000
HALF_SPACE = 2**30

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
    expired_lookup_offsets: int = DEFAULT_EXPIRED_LOOKUP_OFFSETS  # log tail scanned to restore an expired producer

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
        if not 0 <= self.duplicate_lookup_offsets < HALF_SPACE:
            raise ValueError("producer.state.duplicate.lookup.offsets must be in [0, 2**30)")
        if not 0 <= self.expired_lookup_offsets < HALF_SPACE:
            raise ValueError("producer.state.expired.lookup.offsets must be in [0, 2**30)")

    @property
    def stride(self) -> int:
        return 1 if self.dedup_mode == RANGE else self.batches_to_retain

    # Kafka names, snake_case attribute names, and dict keys are all accepted, so this reads
    # whichever config object the broker and storage layers hand over.
    _NAMES = {
        "dedup_mode": ("producer.state.dedup.mode", "producer_state_dedup_mode", "dedup_mode"),
        "batches_to_retain": ("producer.state.batches.to.retain", "producer_state_batches_to_retain",
                              "batches_to_retain"),
        "max_in_flight_sequence_number": ("max.in.flight.sequence.number.per.connection",
                                          "max_in_flight_sequence_number_per_connection",
                                          "max_in_flight_sequence_number"),
        "expiration_ms": ("producer.id.expiration.ms", "producer_id_expiration_ms", "expiration_ms"),
        "duplicate_lookup_offsets": ("producer.state.duplicate.lookup.offsets",
                                     "producer_state_duplicate_lookup_offsets",
                                     "duplicate_lookup_offsets"),
        "expired_lookup_offsets": ("producer.state.expired.lookup.offsets",
                                   "producer_state_expired_lookup_offsets", "expired_lookup_offsets"),
    }

    @classmethod
    def from_any(cls, *sources: Any, base: "ProducerStateConfig | None" = None) -> "ProducerStateConfig":
        """Build from config objects or dicts; later sources win; missing keys keep `base`'s."""
        values = {}
        for field_name in cls._NAMES:
            values[field_name] = getattr(base or _DEFAULT, field_name)
        for src in sources:
            if src is None:
                continue
            for field_name, names in cls._NAMES.items():
                for name in names:
                    if isinstance(src, dict):
                        if name in src and src[name] is not None:
                            values[field_name] = src[name]
                            break
                    elif "." not in name and getattr(src, name, None) is not None:
                        values[field_name] = getattr(src, name)
                        break
        values["dedup_mode"] = str(values["dedup_mode"]).lower()
        for k in ("batches_to_retain", "max_in_flight_sequence_number", "expiration_ms",
                  "duplicate_lookup_offsets", "expired_lookup_offsets"):
            values[k] = int(values[k])
        return cls(**values)


_DEFAULT = ProducerStateConfig()


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
    """The whole state as plain arrays (what snapshots store); batch arrays use `stride`."""
    stride: int
    pid: array
    epoch: array
    updated: array
    head: array
    count: array
    first: array
    last: array
    offset: array
    timestamp: array


class ProducerEntry(NamedTuple):
    """One producer, materialised for inspection (DescribeProducers, tests)."""
    producer_id: int
    epoch: int
    last_sequence: int
    last_timestamp: int
    batches: tuple[tuple[int, int, int, int], ...]  # (first_seq, last_seq, base_offset, timestamp), oldest first


_HASH_MUL = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1
_EMPTY = -1


class ProducerStateManager:
    def __init__(self, config: ProducerStateConfig | None = None) -> None:
        self.config = config or ProducerStateConfig()
        self._stride = self.config.stride
        self._pid = array("q")
        self._epoch = array("h")
        self._updated = array("q")
        self._head = array("H")
        self._count = array("H")
        self._first = array("i")
        self._last = array("i")
        self._offset = array("q")
        self._ts = array("q")
        self._bits = 4
        self._table = array("i", [_EMPTY]) * (1 << self._bits)
        # Producers removed by expiry whose batches may still be in the log: pid -> offset of their
        # newest batch. A batch from one of them is looked up in the log tail before it is judged
        # (storage does the scan), so that a retry arriving after expiry -- even one at sequence 0
        # after an epoch bump -- is answered as the duplicate it is rather than appended again.
        # New producer ids are never in it, so their first batches cost no scan.
        self.expired: dict[int, int] = {}

    # ------------------------------------------------------------ configuration
    @property
    def mode(self) -> str:
        return self.config.dedup_mode

    @property
    def stride(self) -> int:
        return self._stride

    def reconfigure(self, config: ProducerStateConfig) -> None:
        """Take a new config at once; a new window re-lays the rings keeping the newest batches."""
        self.config = config
        if config.stride != self._stride:
            self._relayout(config.stride)

    def _relayout(self, stride: int) -> None:
        old = self._stride
        n = len(self._pid)
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

    # ------------------------------------------------------------ hash table
    def _home(self, pid: int) -> int:
        return ((pid * _HASH_MUL) & _M64) >> (64 - self._bits)

    def _find(self, pid: int) -> int:
        table, pids, mask = self._table, self._pid, (1 << self._bits) - 1
        i = self._home(pid)
        while True:
            s = table[i]
            if s == _EMPTY:
                return -1
            if pids[s] == pid:
                return s
            i = (i + 1) & mask

    def _table_put(self, pid: int, slot: int) -> None:
        table, mask = self._table, (1 << self._bits) - 1
        i = self._home(pid)
        while table[i] != _EMPTY:
            i = (i + 1) & mask
        table[i] = slot

    def _grow_table(self) -> None:
        self._bits += 1
        self._table = array("i", [_EMPTY]) * (1 << self._bits)
        for s, pid in enumerate(self._pid):
            self._table_put(pid, s)

    def _table_index(self, pid: int) -> int:
        table, pids, mask = self._table, self._pid, (1 << self._bits) - 1
        i = self._home(pid)
        while pids[table[i]] != pid:
            i = (i + 1) & mask
        return i

    def _table_delete(self, pid: int) -> None:
        # Linear probing with backward-shift deletion: no tombstones, lookups stay short.
        table, pids, mask = self._table, self._pid, (1 << self._bits) - 1
        i = self._table_index(pid)
        table[i] = _EMPTY
        j = i
        while True:
            j = (j + 1) & mask
            s = table[j]
            if s == _EMPTY:
                return
            k = self._home(pids[s])
            # the entry at j may fill the hole at i unless its home lies cyclically in (i, j]
            if (i < k <= j) if i <= j else (k > i or k <= j):
                continue
            table[i] = s
            table[j] = _EMPTY
            i = j

    # ------------------------------------------------------------ slots
    def _new_slot(self, pid: int, epoch: int) -> int:
        s = len(self._pid)
        if (s + 1) * 4 > (3 << self._bits):  # keep the table at most 3/4 full
            self._grow_table()
        self._pid.append(pid)
        self._epoch.append(epoch)
        self._updated.append(0)
        self._head.append(0)
        self._count.append(0)
        zeros_i = array("i", bytes(4 * self._stride))
        zeros_q = array("q", bytes(8 * self._stride))
        self._first.extend(zeros_i)
        self._last.extend(zeros_i)
        self._offset.extend(zeros_q)
        self._ts.extend(zeros_q)
        self._table_put(pid, s)
        return s

    def _remove_slot(self, s: int) -> None:
        """Swap-remove: the last slot moves into `s` so the arrays stay dense."""
        self._table_delete(self._pid[s])
        last = len(self._pid) - 1
        stride = self._stride
        if s != last:
            moved = self._pid[last]
            self._table[self._table_index(moved)] = s
            for arr in (self._pid, self._epoch, self._updated, self._head, self._count):
                arr[s] = arr[last]
            a, b = s * stride, last * stride
            for arr in (self._first, self._last, self._offset, self._ts):
                arr[a:a + stride] = arr[b:b + stride]
        for arr in (self._pid, self._epoch, self._updated, self._head, self._count):
            arr.pop()
        for arr in (self._first, self._last, self._offset, self._ts):
            del arr[last * stride:]

    # ------------------------------------------------------------ validation
    def check(self, producer_id: int, epoch: int, first_seq: int, last_seq: int) -> Check:
        """Decide what to do with a client batch. Never mutates."""
        s = self._find(producer_id)
        if s < 0:
            if first_seq != 0:
                # The seed's rule: state lost (expiry, deleted log) is not data loss by itself;
                # the client compares our log start offset with its last acknowledged offset.
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
        if 0 < older < HALF_SPACE and distance_below(oldest_first, first_seq) >= older:
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
        """Record a batch without validation (commit, and replay of the log at recovery)."""
        s = self._find(producer_id)
        if s < 0:
            if self.expired:
                self.expired.pop(producer_id, None)
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

    def remove_expired(self, now_ms: int) -> int:
        """Forget producers idle for producer.id.expiration.ms; returns how many."""
        cutoff = now_ms - self.config.expiration_ms
        expired = [s for s, t in enumerate(self._updated) if t <= cutoff]
        stride = self._stride
        for s in expired:
            if self._count[s]:
                newest = s * stride + (self._head[s] + self._count[s] - 1) % stride
                self.expired[self._pid[s]] = self._offset[newest]
        while len(self.expired) > MAX_EXPIRED_REMEMBERED:  # oldest first: dicts keep insertion order
            del self.expired[next(iter(self.expired))]
        for s in reversed(expired):  # highest first, so swap-remove never moves a pending slot
            self._remove_slot(s)
        return len(expired)

    def forget_expired_before(self, log_start_offset: int) -> None:
        """Expired producers whose newest batch the log no longer holds need no lookup."""
        if self.expired:
            self.expired = {p: o for p, o in self.expired.items() if o >= log_start_offset}

    def clear(self) -> None:
        self.__init__(self.config)

    # ------------------------------------------------------------ inspection
    def __len__(self) -> int:
        return len(self._pid)

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
        return ProducerEntry(self._pid[s], self._epoch[s], batches[-1][1] if batches else -1,
                             self._updated[s], tuple(batches))

    def entries(self) -> Iterator[ProducerEntry]:
        for s in range(len(self._pid)):
            yield self._entry(s)

    def memory_bytes(self) -> int:
        """Bytes held by the arrays (what the state costs; the manager object itself is constant)."""
        return sum(sys.getsizeof(a) for a in (
            self._pid, self._epoch, self._updated, self._head, self._count,
            self._first, self._last, self._offset, self._ts, self._table))

    # ------------------------------------------------------------ snapshots
    def columns(self) -> ProducerSnapshotColumns:
        return ProducerSnapshotColumns(self._stride, self._pid, self._epoch, self._updated, self._head,
                                       self._count, self._first, self._last, self._offset, self._ts)

    def load_columns(self, cols: ProducerSnapshotColumns, now_ms: int | None = None) -> None:
        """Replace the state with snapshot columns; re-lays them if the window changed since, and
        drops producers already expired at `now_ms`."""
        n = len(cols.pid)
        for arr, per in ((cols.epoch, 1), (cols.updated, 1), (cols.head, 1), (cols.count, 1),
                         (cols.first, cols.stride), (cols.last, cols.stride), (cols.offset, cols.stride),
                         (cols.timestamp, cols.stride)):
            if len(arr) != n * per:
                raise ValueError("snapshot columns disagree in length")
        if any(c > cols.stride for c in cols.count) or any(h >= cols.stride for h in cols.head):
            raise ValueError("snapshot ring positions out of range")
        self._stride = cols.stride
        self._pid, self._epoch, self._updated = array("q", cols.pid), array("h", cols.epoch), array("q", cols.updated)
        self._head, self._count = array("H", cols.head), array("H", cols.count)
        self._first, self._last = array("i", cols.first), array("i", cols.last)
        self._offset, self._ts = array("q", cols.offset), array("q", cols.timestamp)
        self._bits = 4
        while n * 4 > (3 << self._bits):
            self._bits += 1
        self._table = array("i", [_EMPTY]) * (1 << self._bits)
        for s, pid in enumerate(self._pid):
            if self._find(pid) >= 0:
                raise ValueError(f"snapshot lists producer {pid} twice")
            self._table_put(pid, s)
        if self.config.stride != self._stride:
            self._relayout(self.config.stride)
        if now_ms is not None:
            self.remove_expired(now_ms)

