"""The transaction coordinator's decisions: sans-IO, time and producer ids passed in.

Kafka's prepare -> append -> complete cycle (`TransactionCoordinator`, `TransactionMetadata`,
`TransactionStateManager`), in the controller's decide/replay shape:

- every request is one `prepare_*` call, which returns an `Answer` (nothing to write) or a
  `Transition` (the `__transaction_state` record to append, the metadata after it, the reply);
  the id then has a *pending* transition and other requests for it get CONCURRENT_TRANSACTIONS;
- the caller appends `transition.record()` with acks=-1 (fsynced), then calls `complete` — the
  only place the cache changes — or, if the append failed, `abort_pending`;
- completing a Prepare* returns a `MarkerJob` and leaves the Complete* transition pending; the
  marker writer appends `job.completion` once every partition acknowledged its marker;
- loading a `__transaction_state` partition (`begin_load`, `replay`, `finish_load`) rebuilds the
  cache from its records and returns a `MarkerJob` for every transaction left in Prepare*, which is
  how a crash or a leader move resumes them.

Differences from Kafka, none visible on the wire except the second: the cache is never touched
before an append is durable (so a failed fence needs no `hasFailedEpochFence`), and while a fence
is being written the fenced producer is told CONCURRENT_TRANSACTIONS (retriable; its retry then
gets PRODUCER_FENCED) where Kafka, having bumped its cache early, says PRODUCER_FENCED at once.
The last epoch and last producer id are persisted, so KIP-360 retries survive a coordinator move.

Transactions V2 (KIP-890 part 2; `transaction_version=TV_2` on EndTxn v5 and on the partition
leaders' implicit adds): every EndTxn bumps the epoch (a new producer id when it is exhausted, its
markers at MAX_EPOCH of the old one), answers the (id, epoch) the client continues with, tells a
retry by the bumped epoch, and aborts from Empty or Complete* too (`_end_txn_v2`).

Not here: the idempotent InitProducerId (no transactional id: a new id at epoch 0, the broker's
business), authorization, and the per-version rewriting of codes (`core/txn/errors.py`).

One concern in one module, over 600 lines on purpose: the coordinator's state transitions, which
read best side by side.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from oncelog.core.producer_epoch import EPOCH_EXHAUSTED_AT, MAX_EPOCH, is_epoch_exhausted
from oncelog.core.txn.errors import translate_append_error
from oncelog.core.txn.log_format import CONSUMER_OFFSETS_TOPIC, decode_key, decode_value, encode_record, partition_for
from oncelog.core.txn.state import (
    COMPLETED,
    IDLE,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    PREPARED,
    TV_0,
    TV_2,
    TWO_PC_TIMEOUT_MS,
    TopicPartition,
    TransactionMetadata,
    TxnState,
    is_valid_transition,
)
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

E = ErrorCode
S = TxnState
COMMIT, ABORT = True, False  # WriteTxnMarkers' TransactionResult

DEFAULT_MAX_TIMEOUT_MS = 900_000                 # transaction.max.timeout.ms
DEFAULT_ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000  # transactional.id.expiration.ms
DEFAULT_NUM_PARTITIONS = 50                      # transaction.state.log.num.partitions
DEFAULT_OFFSETS_PARTITIONS = 50                  # offsets.topic.num.partitions


class CoordinatorInvariantError(AssertionError):
    """The coordinator found its own state inconsistent: a bug, never a client's fault."""


@dataclass(frozen=True, slots=True)
class TxnConfig:
    max_timeout_ms: int = DEFAULT_MAX_TIMEOUT_MS
    transactional_id_expiration_ms: int = DEFAULT_ID_EXPIRATION_MS
    num_partitions: int = DEFAULT_NUM_PARTITIONS
    offsets_topic_partitions: int = DEFAULT_OFFSETS_PARTITIONS
    # transaction.two.phase.commit.enable (KIP-939; Kafka's default false)
    two_phase_commit_enable: bool = False

    def __post_init__(self) -> None:
        if self.max_timeout_ms < 1:
            raise ValueError("transaction.max.timeout.ms must be at least 1")
        if self.transactional_id_expiration_ms < 1:
            raise ValueError("transactional.id.expiration.ms must be at least 1")
        if self.num_partitions < 1 or self.offsets_topic_partitions < 1:
            raise ValueError("partition counts must be at least 1")


@dataclass(frozen=True, slots=True)
class Answer:
    """A reply: an error code, and for InitProducerId the id and epoch (v6: and the id and epoch
    of the two-phase-commit transaction a KeepPreparedTxn kept, -1 when none)."""
    error: int = E.NONE
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    ongoing_producer_id: int = NO_PRODUCER_ID
    ongoing_producer_epoch: int = NO_PRODUCER_EPOCH


OK = Answer()


@dataclass(frozen=True, slots=True, eq=False)
class Transition:
    """One record to append and what it changes. Compared by identity: `complete` accepts only the
    transition that is pending for its id."""
    partition: int                     # of __transaction_state
    coordinator_epoch: int
    transactional_id: str
    before: TransactionMetadata | None  # None: an id not yet written
    after: TransactionMetadata | None   # None: a tombstone (the id expires)
    reply: Answer | None                # for the request, once durable; None: the coordinator's own
    via: TxnState | None = None         # PrepareEpochFence for a fence (pending-only state)

    @property
    def target(self) -> TxnState:
        return S.DEAD if self.after is None else self.after.state

    def record(self) -> tuple[bytes, bytes | None]:
        return encode_record(self.transactional_id, self.after)


@dataclass(frozen=True, slots=True, eq=False)
class MarkerJob:
    """Markers to write for a transaction in Prepare*, then `completion` to append."""
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: frozenset[TopicPartition]
    completion: Transition
    # the transaction's version, sent with each marker (KIP-1228): partitions take a V2 marker only
    # above the producer's epoch there (`core.producer_epoch.marker_error`)
    transaction_version: int = TV_0


@dataclass(frozen=True, slots=True)
class Completion:
    reply: Answer | None
    markers: MarkerJob | None = None


class _Entry:
    __slots__ = ("meta", "pending")

    def __init__(self, meta: TransactionMetadata | None) -> None:
        self.meta = meta
        self.pending: Transition | None = None


@dataclass(slots=True)
class _TxnPartition:
    epoch: int
    loading: bool = True
    entries: dict[str, _Entry] = field(default_factory=dict)
    ongoing: set[str] = field(default_factory=set)  # ids in Ongoing: what the timeout sweep reads


class TransactionCoordinator:
    """The coordinator of the `__transaction_state` partitions this broker leads.

    `new_producer_id()` returns a fresh producer id or raises KafkaProtocolError (for example
    COORDINATOR_LOAD_IN_PROGRESS while no producer-id block is at hand); it is called only when a
    decision needs a new id, and must not block.
    """

    def __init__(self, new_producer_id: Callable[[], int], config: TxnConfig | None = None) -> None:
        self.config = config or TxnConfig()
        self._new_producer_id = new_producer_id
        self._partitions: dict[int, _TxnPartition] = {}

    # ------------------------------------------------------------------ ownership
    def partition_of(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.config.num_partitions)

    def offsets_partition(self, group_id: str) -> TopicPartition:
        """The `__consumer_offsets` partition AddOffsetsToTxn adds for `group_id`."""
        return CONSUMER_OFFSETS_TOPIC, partition_for(group_id, self.config.offsets_topic_partitions)

    def owned(self) -> dict[int, int]:
        """Loaded partitions -> coordinator epoch."""
        return {p: part.epoch for p, part in self._partitions.items() if not part.loading}

    def _lookup(self, transactional_id: str) -> tuple[_TxnPartition | None, int, int]:
        p = self.partition_of(transactional_id)
        part = self._partitions.get(p)
        if part is None:
            return None, p, E.NOT_COORDINATOR
        if part.loading:
            return None, p, E.COORDINATOR_LOAD_IN_PROGRESS
        return part, p, E.NONE

    def get(self, transactional_id: str) -> TransactionMetadata | None:
        """The durable metadata of an id this coordinator owns (None if unknown or not owned)."""
        part, _p, err = self._lookup(transactional_id)
        entry = part.entries.get(transactional_id) if part is not None else None
        return entry.meta if entry is not None else None

    def pending(self, transactional_id: str) -> Transition | None:
        part, _p, _err = self._lookup(transactional_id)
        entry = part.entries.get(transactional_id) if part is not None else None
        return entry.pending if entry is not None else None

    # ------------------------------------------------------------------ loading
    def begin_load(self, partition: int, coordinator_epoch: int) -> None:
        """This broker now leads `partition` at `coordinator_epoch`: forget whatever it held for it
        and answer COORDINATOR_LOAD_IN_PROGRESS until `finish_load`."""
        self._partitions[partition] = _TxnPartition(coordinator_epoch)

    def replay(self, partition: int, key: bytes, value: bytes | None) -> None:
        """Apply one record read from the partition (the last record of an id wins, a tombstone
        removes it). ValueError for a record no coordinator wrote."""
        part = self._partitions.get(partition)
        if part is None or not part.loading:
            raise CoordinatorInvariantError(f"replay into __transaction_state-{partition}, which is not loading")
        tid = decode_key(key)
        if self.partition_of(tid) != partition:
            raise ValueError(f"transactional id {tid!r} does not belong to partition {partition}")
        meta = decode_value(tid, value)
        if meta is None:
            part.entries.pop(tid, None)
        else:
            part.entries[tid] = _Entry(meta)

    def finish_load(self, partition: int, coordinator_epoch: int, now_ms: int) -> list[MarkerJob]:
        """Serve the partition; returns the markers to (re)send for every transaction in Prepare*
        (their Complete* transitions are pending). [] if the load was superseded meanwhile."""
        part = self._partitions.get(partition)
        if part is None or not part.loading or part.epoch != coordinator_epoch:
            return []
        part.loading = False
        part.ongoing = {tid for tid, e in part.entries.items() if e.meta is not None and e.meta.state == S.ONGOING}
        jobs = []
        for entry in part.entries.values():
            if entry.meta is not None and entry.meta.state in PREPARED:
                jobs.append(self._completion_job(partition, part, entry, entry.meta, now_ms))
        return jobs

    def load(self, partition: int, coordinator_epoch: int, records: Iterable[tuple[bytes, bytes | None]],
             now_ms: int) -> list[MarkerJob]:
        """begin_load + replay every record + finish_load."""
        self.begin_load(partition, coordinator_epoch)
        for key, value in records:
            self.replay(partition, key, value)
        return self.finish_load(partition, coordinator_epoch, now_ms)

    def unload(self, partition: int, coordinator_epoch: int | None = None) -> None:
        """Another broker leads `partition` now (or it went offline): drop its cache; pending
        transitions of it will complete with NOT_COORDINATOR."""
        part = self._partitions.get(partition)
        if part is not None and (coordinator_epoch is None or part.epoch <= coordinator_epoch):
            del self._partitions[partition]

    def snapshot_records(self, partition: int) -> list[tuple[bytes, bytes | None]]:
        """The records that rebuild the partition's durable state (compaction by snapshot)."""
        part = self._partitions.get(partition)
        if part is None:
            return []
        return [encode_record(tid, e.meta) for tid, e in sorted(part.entries.items()) if e.meta is not None]

    # ------------------------------------------------------------------ transitions
    def _begin(self, part: _TxnPartition, p: int, tid: str, entry: _Entry | None,
               after: TransactionMetadata | None, reply: Answer | None,
               via: TxnState | None = None) -> Transition:
        if entry is None:
            entry = part.entries[tid] = _Entry(None)
        if after is not None and after.state != S.ONGOING and after.ongoing_txn_epoch != NO_PRODUCER_EPOCH:
            after = after.evolve(ongoing_txn_epoch=NO_PRODUCER_EPOCH)  # the kept transaction ended
        t = Transition(p, part.epoch, tid, entry.meta, after, reply, via)
        entry.pending = t
        return t

    def complete(self, transition: Transition, now_ms: int) -> Completion:
        """The transition's record is durable: install it. Returns the reply, and for Prepare* the
        markers to write (the Complete* transition is then pending)."""
        t = transition
        part = self._partitions.get(t.partition)
        entry = part.entries.get(t.transactional_id) if part is not None else None
        if (part is None or part.loading or part.epoch != t.coordinator_epoch or entry is None
                or entry.pending is not t):
            # Unloaded or reloaded meanwhile: the new owner replays the record from the log.
            return Completion(None if t.reply is None else Answer(E.NOT_COORDINATOR))
        before = entry.meta.state if entry.meta is not None else S.EMPTY
        hops = [before, t.via, t.target] if t.via is not None else [before, t.target]
        if not all(is_valid_transition(a, b) for a, b in zip(hops, hops[1:])):
            raise CoordinatorInvariantError(f"{t.transactional_id}: {' -> '.join(s.display_name for s in hops)}")
        entry.pending = None
        if t.after is None:
            del part.entries[t.transactional_id]
            part.ongoing.discard(t.transactional_id)
            return Completion(t.reply)
        entry.meta = t.after
        if t.after.state == S.ONGOING:
            part.ongoing.add(t.transactional_id)
        else:
            part.ongoing.discard(t.transactional_id)
        if t.after.state in PREPARED:
            return Completion(t.reply, self._completion_job(t.partition, part, entry, t.after, now_ms))
        return Completion(t.reply)

    def abort_pending(self, transition: Transition, append_error: int) -> Answer | None:
        """The append failed with `append_error`: drop the transition and answer the request with
        the coordinator's code for that failure. A Complete* transition stays pending: its markers
        are written, so the caller retries the append while it owns the partition."""
        t = transition
        part = self._partitions.get(t.partition)
        entry = part.entries.get(t.transactional_id) if part is not None else None
        if (part is not None and part.epoch == t.coordinator_epoch and entry is not None
                and entry.pending is t and t.target not in COMPLETED):
            entry.pending = None
            if entry.meta is None:
                del part.entries[t.transactional_id]
        return None if t.reply is None else Answer(translate_append_error(append_error))

    def _completion_job(self, p: int, part: _TxnPartition, entry: _Entry, meta: TransactionMetadata,
                        now_ms: int) -> MarkerJob:
        done = S.COMPLETE_COMMIT if meta.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT
        after = meta.evolve(state=done, partitions=frozenset(), update_ms=max(now_ms, meta.update_ms),
                            last_producer_id=meta.producer_id)
        if meta.next_producer_id != NO_PRODUCER_ID:
            # the bump overflowed: the markers closed the old id, the client goes on with the new
            # one (its last epoch stays the one it held, for an EndTxn or InitProducerId retry)
            after = after.evolve(producer_id=meta.next_producer_id, producer_epoch=0,
                                 next_producer_id=NO_PRODUCER_ID)
        completion = self._begin(part, p, meta.transactional_id, entry, after, None)
        return MarkerJob(meta.transactional_id, meta.producer_id, meta.producer_epoch,
                         meta.state == S.PREPARE_COMMIT, part.epoch, meta.partitions, completion,
                         meta.client_transaction_version)

    def _fence(self, part: _TxnPartition, p: int, entry: _Entry, meta: TransactionMetadata,
               now_ms: int, reply: Answer | None) -> Transition | Answer:
        """Bump the epoch of an Ongoing transaction and abort it, in one PrepareAbort record (one
        bump, Transactions V2 included: KAFKA-19367). A V2 transaction at an exhausted epoch also
        moves to a new producer id (KAFKA-20090), so that its client, which goes on after the
        abort, never holds MAX_EPOCH."""
        if meta.producer_epoch >= MAX_EPOCH:
            raise CoordinatorInvariantError(f"{meta.transactional_id}: cannot fence epoch {meta.producer_epoch}")
        next_pid = NO_PRODUCER_ID
        if meta.client_transaction_version >= TV_2 and is_epoch_exhausted(meta.producer_epoch):
            pid = self._producer_id()
            if isinstance(pid, Answer):
                return pid
            next_pid = pid
        after = meta.evolve(state=S.PREPARE_ABORT, producer_epoch=meta.producer_epoch + 1,
                            last_producer_epoch=NO_PRODUCER_EPOCH, last_producer_id=meta.producer_id,
                            next_producer_id=next_pid, update_ms=now_ms)
        return self._begin(part, p, meta.transactional_id, entry, after, reply, via=S.PREPARE_EPOCH_FENCE)

    def _producer_id(self) -> int | Answer:
        try:
            return self._new_producer_id()
        except KafkaProtocolError as e:
            return Answer(e.code)

    # ------------------------------------------------------------------ requests
    def prepare_init_producer_id(self, transactional_id: str, timeout_ms: int, now_ms: int,
                                 producer_id: int = NO_PRODUCER_ID,
                                 producer_epoch: int = NO_PRODUCER_EPOCH, *, enable_2pc: bool = False,
                                 keep_prepared: bool = False) -> Answer | Transition:
        """InitProducerId with a transactional id (v3+ may name the caller's id and epoch; v6 adds
        KIP-939's Enable2Pc and KeepPreparedTxn).

        Enable2Pc: the id's transactions are two-phase commit ones, persisted with
        TWO_PC_TIMEOUT_MS (the requested timeout is ignored, as Kafka ignores it) and never aborted
        by the timeout sweep; refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED where the broker's
        transaction.two.phase.commit.enable is false (Kafka's answer). KeepPreparedTxn (with
        Enable2Pc only, else INVALID_REQUEST): an Ongoing two-phase-commit transaction is kept
        instead of aborted; the epoch is bumped all the same (the crashed producer is fenced) and
        the answer names the transaction's own id and epoch, for the external transaction manager
        to compare with what it recorded before it commits or aborts at the new epoch."""
        tid = transactional_id
        if not tid:
            return Answer(E.INVALID_REQUEST)
        if enable_2pc and not self.config.two_phase_commit_enable:
            return Answer(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        if keep_prepared and not enable_2pc:
            return Answer(E.INVALID_REQUEST)
        if (producer_id == NO_PRODUCER_ID) != (producer_epoch == NO_PRODUCER_EPOCH):
            return Answer(E.INVALID_REQUEST)
        if enable_2pc:
            timeout_ms = TWO_PC_TIMEOUT_MS
        elif not 0 < timeout_ms <= self.config.max_timeout_ms:
            return Answer(E.INVALID_TRANSACTION_TIMEOUT)
        part, p, err = self._lookup(tid)
        if part is None:
            return Answer(err)
        entry = part.entries.get(tid)
        if entry is not None and entry.pending is not None:
            return Answer(E.CONCURRENT_TRANSACTIONS)
        meta = entry.meta if entry is not None else None
        expected = producer_id != NO_PRODUCER_ID
        if meta is None:
            pid = self._producer_id()
            if isinstance(pid, Answer):
                return pid
            fresh = TransactionMetadata(tid, pid, 0, timeout_ms, S.EMPTY, update_ms=now_ms)
            return self._begin(part, p, tid, entry, fresh, Answer(E.NONE, pid, 0))
        if expected and not (producer_id == meta.producer_id or (
                producer_id == meta.last_producer_id and is_epoch_exhausted(producer_epoch))):
            return Answer(E.PRODUCER_FENCED)
        if meta.state in PREPARED:
            return Answer(E.CONCURRENT_TRANSACTIONS)
        if meta.state == S.ONGOING:
            assert entry is not None  # meta came from it
            if keep_prepared and meta.two_phase:
                return self._keep_prepared(part, p, entry, meta, now_ms)
            # Abort the open transaction at a new epoch; the caller retries and gets a second bump
            # (a new producer id if that one exhausts the epochs).
            return self._fence(part, p, entry, meta, now_ms, Answer(E.CONCURRENT_TRANSACTIONS))
        if meta.state not in IDLE:
            raise CoordinatorInvariantError(f"{tid} is in {meta.state.display_name}")
        common = dict(timeout_ms=timeout_ms, state=S.EMPTY, partitions=frozenset(), start_ms=-1,
                      update_ms=now_ms, last_producer_id=meta.producer_id)
        if is_epoch_exhausted(meta.producer_epoch) and (not expected or producer_epoch == meta.producer_epoch):
            pid = self._producer_id()
            if isinstance(pid, Answer):
                return pid
            after = meta.evolve(producer_id=pid, producer_epoch=0,
                                last_producer_epoch=meta.producer_epoch if expected else NO_PRODUCER_EPOCH,
                                **common)
        elif not expected:
            after = meta.evolve(producer_epoch=meta.producer_epoch + 1, last_producer_epoch=NO_PRODUCER_EPOCH,
                                **common)
        elif producer_epoch == meta.producer_epoch:
            after = meta.evolve(producer_epoch=meta.producer_epoch + 1,
                                last_producer_epoch=meta.producer_epoch, **common)
        elif producer_epoch == meta.last_producer_epoch:
            # A retry of a bump whose answer was lost: the epoch it already got, no second bump.
            after = meta.evolve(**common)
        else:
            return Answer(E.PRODUCER_FENCED)
        return self._begin(part, p, tid, entry, after, Answer(E.NONE, after.producer_id, after.producer_epoch))

    def _keep_prepared(self, part: _TxnPartition, p: int, entry: _Entry, meta: TransactionMetadata,
                       now_ms: int) -> Answer | Transition:
        """KeepPreparedTxn on an Ongoing two-phase-commit transaction: one record, still Ongoing
        with its partitions and start time, at the next epoch, so the producer that prepared it (a
        zombie, if it still runs) is fenced from EndTxn and from adding partitions, and the new
        one completes it. The transaction's own epoch is kept (`ongoing_txn_epoch`) across any
        number of such restarts."""
        if is_epoch_exhausted(meta.producer_epoch):
            # Kafka would move to a new producer id here (its nextProducerId); the id the manager
            # recorded must stay, so the manager is told to complete it some other way (by hand).
            return Answer(E.INVALID_TXN_STATE)
        kept = meta.ongoing_txn_epoch if meta.ongoing_txn_epoch != NO_PRODUCER_EPOCH else meta.producer_epoch
        after = meta.evolve(producer_epoch=meta.producer_epoch + 1, last_producer_epoch=NO_PRODUCER_EPOCH,
                            last_producer_id=meta.producer_id, ongoing_txn_epoch=kept, update_ms=now_ms)
        return self._begin(part, p, meta.transactional_id, entry, after,
                           Answer(E.NONE, meta.producer_id, after.producer_epoch, meta.producer_id, kept))

    def _check_producer(self, tid: str, producer_id: int, producer_epoch: int
                        ) -> tuple[_TxnPartition | None, int, _Entry | None, int]:
        """(partition, index, entry, error) after Kafka's common checks: id known, pid, epoch."""
        if not tid:
            return None, -1, None, E.INVALID_REQUEST
        part, p, err = self._lookup(tid)
        if part is None:
            return None, p, None, err
        entry = part.entries.get(tid)
        if entry is None or entry.meta is None or entry.meta.producer_id != producer_id:
            return part, p, entry, E.INVALID_PRODUCER_ID_MAPPING
        if entry.meta.producer_epoch != producer_epoch:
            return part, p, entry, E.PRODUCER_FENCED
        return part, p, entry, E.NONE

    def prepare_add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                               partitions: Iterable[TopicPartition], now_ms: int,
                               transaction_version: int = TV_0) -> Answer | Transition:
        """AddPartitionsToTxn v0-3 (and v4 without VerifyOnly), AddOffsetsToTxn via
        `prepare_add_offsets`; with TV_2, a partition leader's implicit add (Produce v12+,
        TxnOffsetCommit v5+, through AddPartitionsToTxn v5), which checks a pending transition
        first: right after an overflow the client already uses the new producer id while the
        Complete* that installs it is being written (KAFKA-18660)."""
        if transaction_version >= TV_2:
            pending = self.pending(transactional_id)
            if pending is not None:
                return Answer(E.CONCURRENT_TRANSACTIONS)
        part, p, entry, err = self._check_producer(transactional_id, producer_id, producer_epoch)
        if err:
            return Answer(err)
        assert part is not None and entry is not None and entry.meta is not None
        meta = entry.meta
        if entry.pending is not None or meta.state in PREPARED:
            return Answer(E.CONCURRENT_TRANSACTIONS)
        added = frozenset(partitions)
        if meta.state == S.ONGOING and added <= meta.partitions:
            return OK
        if meta.state not in IDLE and meta.state != S.ONGOING:
            raise CoordinatorInvariantError(f"{transactional_id} is in {meta.state.display_name}")
        after = meta.evolve(state=S.ONGOING, partitions=meta.partitions | added,
                            start_ms=now_ms if meta.state in IDLE else meta.start_ms,
                            update_ms=now_ms, last_producer_id=meta.producer_id,
                            client_transaction_version=transaction_version)
        return self._begin(part, p, transactional_id, entry, after, OK)

    def prepare_add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int,
                            group_id: str, now_ms: int) -> Answer | Transition:
        """AddOffsetsToTxn: the group's `__consumer_offsets` partition joins the transaction."""
        return self.prepare_add_partitions(transactional_id, producer_id, producer_epoch,
                                           (self.offsets_partition(group_id),), now_ms)

    def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """AddPartitionsToTxn v4 VerifyOnly (KIP-890 part 1): is each partition in the transaction?
        Writes nothing; pending transitions are not consulted (partitions only join once durable)."""
        wanted = list(partitions)
        _part, _p, entry, err = self._check_producer(transactional_id, producer_id, producer_epoch)
        if not err and entry is not None and entry.meta is not None and entry.meta.state in PREPARED:
            err = E.CONCURRENT_TRANSACTIONS
        if err:
            return {tp: err for tp in wanted}
        assert entry is not None and entry.meta is not None
        members = entry.meta.partitions
        return {tp: E.NONE if tp in members else E.TRANSACTION_ABORTABLE for tp in wanted}

    def prepare_end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                        commit: bool, now_ms: int, transaction_version: int = TV_0) -> Answer | Transition:
        """EndTxn v0-4: Ongoing -> Prepare*; retries of a finished one answer NONE. EndTxn v5+
        (TV_2): `_end_txn_v2`."""
        if transaction_version >= TV_2:
            return self._end_txn_v2(transactional_id, producer_id, producer_epoch, commit, now_ms)
        part, p, entry, err = self._check_producer(transactional_id, producer_id, producer_epoch)
        if err:
            return Answer(err)
        assert part is not None and entry is not None and entry.meta is not None
        # A Prepare* transaction always has its Complete* pending while markers are written; the
        # table below, not the pending state, answers it (INVALID_TXN_STATE for the other result).
        if entry.pending is not None and entry.pending.target not in COMPLETED:
            return Answer(E.CONCURRENT_TRANSACTIONS)
        meta = entry.meta
        state = meta.state
        if state == S.ONGOING:
            # the markers say what ended the transaction: an EndTxn v4 bumped nothing, even when a
            # Produce v12 labelled the transaction V2 (Kafka's prepareAbortOrCommit records the
            # EndTxn's version); as V2 markers at this epoch they would keep the checks of this
            # very transaction's late batches (`core.txn.verification`)
            after = meta.evolve(state=S.PREPARE_COMMIT if commit else S.PREPARE_ABORT, update_ms=now_ms,
                                last_producer_id=meta.producer_id, client_transaction_version=transaction_version)
            return self._begin(part, p, transactional_id, entry, after, OK)
        if state == (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT):
            return OK
        if state == (S.PREPARE_COMMIT if commit else S.PREPARE_ABORT):
            return Answer(E.CONCURRENT_TRANSACTIONS)
        return Answer(E.INVALID_TXN_STATE)

    def _end_txn_v2(self, tid: str, producer_id: int, producer_epoch: int, commit: bool,
                    now_ms: int) -> Answer | Transition:
        """EndTxn under Transactions V2 (Kafka 4.0's `TransactionCoordinator.endTransaction`,
        with KAFKA-18660's check order: a pending transition first, then the producer id, then
        the epoch). A retry carries the epoch before the bump (or, after an overflow, the
        previous producer id at EPOCH_EXHAUSTED_AT) and is answered from the completed state,
        with the (id, epoch) the client continues with; an ABORT at the current epoch from Empty
        or Complete* bumps too (the client cannot know whether a partition was added for it)."""
        if not tid:
            return Answer(E.INVALID_REQUEST)
        part, p, err = self._lookup(tid)
        if part is None:
            return Answer(err)
        entry = part.entries.get(tid)
        if entry is None or entry.meta is None:
            return Answer(E.INVALID_PRODUCER_ID_MAPPING)
        if entry.pending is not None:
            return Answer(E.CONCURRENT_TRANSACTIONS)
        meta = entry.meta
        bumped = meta.client_transaction_version >= TV_2 and producer_epoch >= 0
        overflow_retry = (bumped and meta.producer_id != producer_id and meta.last_producer_id == producer_id
                          and producer_epoch == EPOCH_EXHAUSTED_AT and meta.producer_epoch == 0)
        retry = overflow_retry or (bumped and meta.producer_epoch == producer_epoch + 1)
        if meta.producer_id != producer_id and not overflow_retry:
            return Answer(E.INVALID_PRODUCER_ID_MAPPING)
        state = meta.state
        current = producer_epoch == meta.producer_epoch
        if not (current if state in (S.ONGOING, S.EMPTY) else retry or current):
            return Answer(E.PRODUCER_FENCED)
        if state in PREPARED:   # its Complete* is pending: answered above
            raise CoordinatorInvariantError(f"{tid} is in {state.display_name} with nothing pending")
        if retry:
            if state == (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT):
                return Answer(E.NONE, meta.producer_id, meta.producer_epoch)
            return Answer(E.INVALID_TXN_STATE)
        if state != S.ONGOING and commit:
            return Answer(E.INVALID_TXN_STATE)
        return self._bump_and_end(part, p, entry, meta, commit, now_ms)

    def _bump_and_end(self, part: _TxnPartition, p: int, entry: _Entry, meta: TransactionMetadata,
                      commit: bool, now_ms: int) -> Answer | Transition:
        """Prepare* at the next epoch (TV_2). At an exhausted epoch the markers carry MAX_EPOCH
        of the old id and the client is told the new id at epoch 0 (KAFKA-18660)."""
        epoch = meta.producer_epoch
        changes: dict[str, object] = dict(state=S.PREPARE_COMMIT if commit else S.PREPARE_ABORT, update_ms=now_ms,
                             last_producer_id=meta.producer_id, last_producer_epoch=epoch,
                             client_transaction_version=TV_2)
        if meta.state != S.ONGOING:   # an abort of nothing the coordinator knows of
            changes.update(partitions=frozenset(), start_ms=now_ms)
        if is_epoch_exhausted(epoch):
            pid = self._producer_id()
            if isinstance(pid, Answer):
                return pid
            after = meta.evolve(producer_epoch=MAX_EPOCH, next_producer_id=pid, **changes)
            reply = Answer(E.NONE, pid, 0)
        else:
            after = meta.evolve(producer_epoch=epoch + 1, **changes)
            reply = Answer(E.NONE, meta.producer_id, epoch + 1)
        return self._begin(part, p, meta.transactional_id, entry, after, reply)

    # ------------------------------------------------------------------ timers
    def expire_timed_out(self, now_ms: int, partition: int | None = None) -> list[Transition]:
        """Ongoing transactions older than their timeout: fence the epoch and abort
        (transaction.abort.timed.out.transaction.cleanup.interval.ms). `partition`: only that
        `__transaction_state` partition's (a sweep a step at a time)."""
        out = []
        for p, part in self._partitions.items():
            if part.loading or (partition is not None and p != partition):
                continue
            for tid in sorted(part.ongoing):
                entry = part.entries[tid]
                meta = entry.meta
                assert meta is not None
                # a two-phase-commit transaction waits for its manager, however long (KIP-939)
                if entry.pending is None and not meta.two_phase and meta.start_ms + meta.timeout_ms < now_ms:
                    t = self._fence(part, p, entry, meta, now_ms, None)
                    if isinstance(t, Transition):   # else no producer id at hand: next sweep
                        out.append(t)
        return out

    def expire_transactional_ids(self, now_ms: int, partition: int | None = None) -> list[Transition]:
        """Idle ids not updated for transactional.id.expiration.ms: tombstones to append.
        `partition`: only that `__transaction_state` partition's."""
        cutoff = now_ms - self.config.transactional_id_expiration_ms
        out = []
        for p, part in self._partitions.items():
            if part.loading or (partition is not None and p != partition):
                continue
            for tid, entry in sorted(part.entries.items()):
                meta = entry.meta
                if (entry.pending is None and meta is not None and meta.state in IDLE
                        and meta.update_ms <= cutoff):
                    out.append(self._begin(part, p, tid, entry, None, None))
        return out

    # ------------------------------------------------------------------ admin
    def describe(self, transactional_id: str) -> tuple[int, TransactionMetadata | None]:
        """DescribeTransactions for one id: (error, metadata)."""
        if not transactional_id:
            return E.INVALID_REQUEST, None
        part, _p, err = self._lookup(transactional_id)
        if part is None:
            return err, None
        entry = part.entries.get(transactional_id)
        if entry is None or entry.meta is None:
            return E.TRANSACTIONAL_ID_NOT_FOUND, None
        return E.NONE, entry.meta

    def list_transactions(self, now_ms: int, states: Iterable[str] = (), producer_ids: Iterable[int] = (),
                          duration_ms: int = -1) -> tuple[int, list[str], list[TransactionMetadata]]:
        """ListTransactions: (error, unknown state filters, matching metadata) over owned partitions."""
        if any(part.loading for part in self._partitions.values()):
            return E.COORDINATOR_LOAD_IN_PROGRESS, [], []
        names = list(states)
        wanted = {TxnState.from_name(n) for n in names} - {None}
        unknown = [n for n in names if TxnState.from_name(n) is None]
        pids = set(producer_ids)
        out = []
        for meta in self._all():
            if pids and meta.producer_id not in pids:
                continue
            if names and meta.state not in wanted:
                continue
            if duration_ms >= 0 and now_ms - meta.start_ms <= duration_ms:
                continue
            out.append(meta)
        return E.NONE, unknown, out

    def _all(self) -> Iterator[TransactionMetadata]:
        for part in self._partitions.values():
            for entry in part.entries.values():
                if entry.meta is not None:
                    yield entry.meta
