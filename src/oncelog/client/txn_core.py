"""The transactional producer's decisions, without I/O (h11 style, like `producer_core`): user calls
and coordinator answers go in, the next request to send comes out. Modelled on Java's
`TransactionManager` and librdkafka's `rdkafka_txnmgr.c` (KIP-98, KIP-360, KIP-447, and
Transactions V2, KIP-890 part 2, when the cluster finalizes `transaction.version` 2). The shell's
loop, one transactional request in flight at a time:

    out = tm.next_request(now_ms)          # None: nothing due (see next_wake_ms)
    ... send out.request to out.node (None: any broker), then exactly one of
    tm.on_response(response, now_ms) / tm.on_request_failed(now_ms)

User calls (`init_transactions`, `begin_transaction`, `send_offsets_to_transaction`,
`commit_transaction`, `abort_transaction`) raise at once for an illegal call, or return a
`TxnResult` that resolves exactly once. A call left unresolved (the caller timed out) must be
made again, which returns the same result (librdkafka #3297: never another EndTxn result).

Error classes (reference §5): fatal (`TransactionFatalError`, `ProducerFencedError`: the
producer is finished) — PRODUCER_FENCED and INVALID_PRODUCER_EPOCH from coordinator APIs,
INVALID_TXN_STATE, TRANSACTIONAL_ID/CLUSTER_AUTHORIZATION_FAILED, UNSUPPORTED_VERSION, anything
unexpected; abortable (`TransactionAbortableError`: abort, then go on) — any failed batch,
TRANSACTION_ABORTABLE, TOPIC/GROUP_AUTHORIZATION_FAILED, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
FENCED_INSTANCE_ID, UNKNOWN_PRODUCER_ID; retried inside — CONCURRENT_TRANSACTIONS, load in
progress, and coordinator errors, which find the coordinator again.

The seam with the idempotent producer core (`TxnProducer` one way, `ProducerCore.txn` the other):
batches of a partition are drained only once AddPartitionsToTxn for it succeeded (`may_send`);
a batch that fails for good, or a gap in a partition's sequences, makes the transaction
abortable (`on_batch_failed`, `on_sequence_gap`) and the next abort bumps the epoch with
InitProducerId(pid, epoch) (KIP-360), after which every partition's sequences start at 0
(`TxnProducer.start_epoch`). EndTxn and that bump wait until every batch of the transaction has
an outcome (`TxnProducer.has_incomplete`).

Transactions V2 (Java's `isTransactionV2Enabled`): decided from the finalized `transaction.version`
the shell reports (`features`) when init_transactions completes and after each EndTxn, so a
transaction ends in the version it began. Under V2 no AddPartitionsToTxn or AddOffsetsToTxn is
sent: a partition may be drained as soon as a record for it is queued (its leader adds it), the
offsets go straight to TxnOffsetCommit (v5), and every EndTxn (v5) answers the producer id and
epoch to go on with, sequences from 0, which also recovers from abortable errors (no KIP-360
bump, except when the coordinator lost the producer id). A V1 producer that finds V2 finalized
bumps its epoch once after its last V1 transaction, so the first V2 one starts fresh.

Two-phase commit (KIP-939, `transaction.two.phase.commit.enable`): init_transactions asks for
Enable2Pc (InitProducerId v6), so the coordinator never aborts this producer's transactions by
timeout; `prepare_transaction` (after the shell flushed every record) returns a
`PreparedTxnState` for an external transaction manager to record, and leaves the transaction
open (PREPARED_TRANSACTION: only completing it is allowed). After a crash,
`init_transactions(keep_prepared_txn=True)` keeps the open transaction (the coordinator bumps the
epoch, fencing the crashed producer) and learns its id and epoch; `complete_transaction(state)`
commits it if `state` names it, else aborts it (and says so): Java's KafkaProducer API as the KIP
describes it, which no Kafka release ships.

One concern in one module, over 600 lines on purpose: the transactional producer's state machine
(Java's TransactionManager is one class too).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from itertools import count
from typing import Any, Protocol

from oncelog.client.errors import (
    KafkaClientError,
    ProducerFatalError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionFatalError,
    TransactionStateError,
)
from oncelog.client.types import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition
from oncelog.protocol.errors import RETRIABLE, ErrorCode, error_code

log = logging.getLogger("oncelog.client.transactions")

E = ErrorCode
# Java's ADD_PARTITIONS_RETRY_BACKOFF_MS: the first AddPartitionsToTxn of a transaction usually
# meets CONCURRENT_TRANSACTIONS only because the previous one is still writing its markers.
ADD_PARTITIONS_RETRY_BACKOFF_MS = 20


class TxnState(Enum):
    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    COMMITTING_TRANSACTION = "COMMITTING_TRANSACTION"
    ABORTING_TRANSACTION = "ABORTING_TRANSACTION"
    PREPARED_TRANSACTION = "PREPARED_TRANSACTION"   # KIP-939: flushed, waiting for its manager
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"


S = TxnState
# Java's State.isTransitionValid, as data. FATAL_ERROR may follow any state.
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    # + ABORTING_TRANSACTION: aborting after an init that failed abortably leaves no producer id,
    # so the producer is back where it was before init_transactions (Java would reach READY)
    S.UNINITIALIZED: frozenset({S.READY, S.ABORTABLE_ERROR, S.ABORTING_TRANSACTION}),
    # + COMMITTING_TRANSACTION: the epoch bump after the last Transactions V1 commit (V2 from then on)
    S.INITIALIZING: frozenset({S.UNINITIALIZED, S.ABORTING_TRANSACTION, S.COMMITTING_TRANSACTION}),
    S.READY: frozenset({S.INITIALIZING, S.COMMITTING_TRANSACTION, S.ABORTING_TRANSACTION}),
    S.IN_TRANSACTION: frozenset({S.READY}),
    S.COMMITTING_TRANSACTION: frozenset({S.IN_TRANSACTION, S.PREPARED_TRANSACTION}),
    S.ABORTING_TRANSACTION: frozenset({S.IN_TRANSACTION, S.ABORTABLE_ERROR, S.PREPARED_TRANSACTION}),
    # prepare_transaction, or init_transactions(keep_prepared_txn=True) finding one open
    S.PREPARED_TRANSACTION: frozenset({S.IN_TRANSACTION, S.INITIALIZING}),
    S.ABORTABLE_ERROR: frozenset({S.IN_TRANSACTION, S.COMMITTING_TRANSACTION, S.ABORTABLE_ERROR,
                                  S.INITIALIZING}),
    S.FATAL_ERROR: frozenset(TxnState),
}


class CoordinatorType(IntEnum):
    GROUP = 0
    TRANSACTION = 1


# ------------------------------------------------------------------ requests and responses
# Plain shapes; the shell encodes them (version chosen from ApiVersions) and decodes answers.

@dataclass(frozen=True)
class FindCoordinatorRequest:
    key_type: int
    key: str


@dataclass(frozen=True)
class InitProducerIdRequest:
    transactional_id: str
    transaction_timeout_ms: int
    producer_id: int = -1      # v3+ (KIP-360): the current id and epoch, to bump them
    producer_epoch: int = -1
    enable_2pc: bool = False   # v6 (KIP-939): sent at v6 only, and only when set
    keep_prepared_txn: bool = False


@dataclass(frozen=True, order=True)
class PreparedTxnState:
    """KIP-939's PreparedTxnState: the producer id and epoch of a prepared transaction, which the
    external transaction manager records with its own decision and gives back to
    `complete_transaction` after a crash. `str()` and `parse` are its serialized form
    ("<producer id>:<epoch>", Java's toString), "" for no transaction."""
    producer_id: int = -1
    epoch: int = -1

    def __str__(self) -> str:
        return "" if self.producer_id < 0 else f"{self.producer_id}:{self.epoch}"

    @classmethod
    def parse(cls, text: str | None) -> PreparedTxnState:
        if not text:
            return cls()
        pid, sep, epoch = text.partition(":")
        try:
            state = cls(int(pid), int(epoch))
        except ValueError:
            raise ValueError(f"not a prepared transaction state: {text!r}") from None
        if not sep or state.producer_id < 0 or not 0 <= state.epoch <= 32767:
            raise ValueError(f"not a prepared transaction state: {text!r}")
        return state

    @property
    def has_transaction(self) -> bool:
        return self.producer_id >= 0


@dataclass(frozen=True)
class AddPartitionsToTxnRequest:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True)
class AddOffsetsToTxnRequest:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str


@dataclass(frozen=True)
class TxnOffsetCommitRequest:
    transactional_id: str
    group_id: str
    producer_id: int
    producer_epoch: int
    generation_id: int               # v3+ (KIP-447)
    member_id: str
    group_instance_id: str | None
    offsets: tuple[tuple[TopicPartition, OffsetAndMetadata], ...]
    v2: bool = False                 # Transactions V2: v5+ (the coordinator adds the partition)


@dataclass(frozen=True)
class EndTxnRequest:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    v2: bool = False                 # Transactions V2: v5+ (the epoch is bumped and answered)


@dataclass(frozen=True)
class FindCoordinatorResponse:
    error_code: int
    node_id: int = -1
    host: str = ""
    port: int = -1


@dataclass(frozen=True)
class InitProducerIdResponse:
    error_code: int
    producer_id: int = -1
    producer_epoch: int = -1
    ongoing_producer_id: int = -1     # v6: the transaction KeepPreparedTxn kept
    ongoing_producer_epoch: int = -1


@dataclass(frozen=True)
class AddPartitionsToTxnResponse:
    results: Mapping[TopicPartition, int]   # v0-3: one code per partition


@dataclass(frozen=True)
class AddOffsetsToTxnResponse:
    error_code: int


@dataclass(frozen=True)
class TxnOffsetCommitResponse:
    results: Mapping[TopicPartition, int]


@dataclass(frozen=True)
class EndTxnResponse:
    error_code: int
    producer_id: int = -1            # v5+: the id and epoch to go on with
    producer_epoch: int = -1


@dataclass(frozen=True)
class Outgoing:
    request: object
    node: int | None   # the coordinator's node id; None = any broker (FindCoordinator)


# ------------------------------------------------------------------ the seam with ProducerCore

class TxnProducer(Protocol):
    """What the transaction manager asks of the idempotent producer core (ProducerCore has it).
    Called only from the manager's own entry points, never from inside a producer callback."""

    def attach_transactions(self, txn: TransactionManager) -> None: ...

    def start_epoch(self, producer_id: int, producer_epoch: int) -> None:
        """A producer id/epoch from InitProducerId: every partition's sequences restart at 0.
        Only called with no batch incomplete."""

    def has_incomplete(self) -> bool:
        """A batch is queued or on the wire (its outcome is not known yet)."""

    def abort_undrained(self, error: BaseException) -> None:
        """Fail, with `error`, the queued batches that were never sent under a valid sequence
        (Java's abortUndrainedBatches); batches that may be in the log stay until resolved."""

    def go_fatal(self, error: BaseException) -> None: ...


class TxnResult:
    """The outcome of one user call: resolves exactly once (a second resolution is a bug and
    raises). The shell waits on it with `add_done_callback` or by polling `done`."""
    __slots__ = ("operation", "done", "error", "_callbacks")

    def __init__(self, operation: str) -> None:
        self.operation = operation
        self.done = False
        self.error: BaseException | None = None
        self._callbacks: list[Callable[[TxnResult], None]] = []

    def add_done_callback(self, fn: Callable[[TxnResult], None]) -> None:
        if self.done:
            fn(self)
        else:
            self._callbacks.append(fn)

    def _resolve(self, error: BaseException | None) -> None:
        if self.done:
            raise RuntimeError(f"{self.operation} resolved twice")
        self.done = True
        self.error = error
        for fn in self._callbacks:
            fn(self)
        self._callbacks.clear()

    def __repr__(self) -> str:
        what = "pending" if not self.done else ("ok" if self.error is None else repr(self.error))
        return f"<TxnResult {self.operation} {what}>"


# Java's Priority: FindCoordinator first, then InitProducerId, adds, EndTxn, and a bump last
# (it follows the EndTxn of the transaction it recovers from).
_FIND, _INIT, _ADD, _END, _BUMP = 0, 1, 2, 3, 4
_COORDINATOR_MOVED = {E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE}
_FENCED = {E.PRODUCER_FENCED, E.INVALID_PRODUCER_EPOCH}   # < v4 / < v2 say the latter
_NEEDS_BUMP = {E.UNKNOWN_PRODUCER_ID, E.INVALID_PRODUCER_ID_MAPPING}
# fatal whichever coordinator request gets them (reference §5)
_FATAL = _FENCED | {E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, E.CLUSTER_AUTHORIZATION_FAILED,
                    E.INVALID_TXN_STATE, E.UNSUPPORTED_VERSION}
_FATAL_BATCH = {E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, E.CLUSTER_AUTHORIZATION_FAILED,
                E.PRODUCER_FENCED, E.UNSUPPORTED_VERSION}
_RESPONSE_OF = {FindCoordinatorRequest: FindCoordinatorResponse,
                InitProducerIdRequest: InitProducerIdResponse,
                AddPartitionsToTxnRequest: AddPartitionsToTxnResponse,
                AddOffsetsToTxnRequest: AddOffsetsToTxnResponse,
                TxnOffsetCommitRequest: TxnOffsetCommitResponse,
                EndTxnRequest: EndTxnResponse}


@dataclass(eq=False)
class _Pending:
    """A request waiting its turn (Java's TxnRequestHandler)."""
    priority: int
    seq: int
    result: TxnResult | None = None
    coordinator: tuple[int, str] | None = None   # (key type, key) it is sent to; None = any node
    not_before_ms: int = 0
    find: tuple[int, str] | None = None          # FindCoordinator: what it looks up
    partitions: set[TopicPartition] = field(default_factory=set)           # AddPartitionsToTxn
    group: ConsumerGroupMetadata | None = None   # AddOffsetsToTxn, TxnOffsetCommit
    offsets: dict[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)
    offset_commit: bool = False
    committed: bool | None = None                # EndTxn
    skip: bool = False                           # EndTxn the coordinator would refuse anyway


class TransactionManager:
    def __init__(self, transactional_id: str, *, transaction_timeout_ms: int = 60000,
                 retry_backoff_ms: int = 100, producer: TxnProducer | None = None,
                 allow_v2: bool = True, two_phase_commit: bool = False) -> None:
        if not transactional_id:
            raise ValueError("transactional.id must be a non-empty string")
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.state = S.UNINITIALIZED
        self.last_error: BaseException | None = None
        self.producer_id = -1
        self.producer_epoch = -1
        # KIP-360 needs InitProducerId v3+ on the coordinator; Java assumes no until it knows
        self.epoch_bump_supported = False
        # Transactions V2: in effect for the current transaction; the cluster's finalized
        # transaction.version (and its epoch) as the shell last reported it
        self.allow_v2 = allow_v2
        self.transaction_v2 = False
        self._finalized_tv = 0
        self._features_epoch = -1
        self._coordinators: dict[tuple[int, str], int] = {}
        self._new_partitions: set[TopicPartition] = set()      # sent to, not yet asked for
        self._pending_partitions: set[TopicPartition] = set()  # in an unanswered AddPartitions
        self._partitions: set[TopicPartition] = set()          # added: batches may be drained
        self._queue: list[_Pending] = []
        self._seq = count()
        self._in_flight: _Pending | None = None
        self._in_flight_request: object = None
        self._transaction_started = False   # something was added: EndTxn must be sent
        self._epoch_bump_required = False
        self._call: TxnResult | None = None  # the last user call's result
        self._producer = producer
        self._producer_failed = False
        self._resumed = False   # resume_transaction: end someone else's transaction, send nothing
        self.two_phase_commit = two_phase_commit   # transaction.two.phase.commit.enable
        self._keep_prepared = False                # asked by the running init_transactions
        # KIP-939: the open transaction init_transactions kept (or prepare_transaction prepared)
        self.prepared: PreparedTxnState | None = None
        self._completing: bool | None = None      # what the running complete_transaction does
        self._expected: tuple[int, int] | None = None   # init_transactions(expected=)
        if producer is not None:
            producer.attach_transactions(self)

    # ------------------------------------------------------------------ facts from the shell

    def coordinator_versions(self, init_producer_id_max: int) -> None:
        """The transaction coordinator's highest InitProducerId version (ApiVersions)."""
        self.epoch_bump_supported = init_producer_id_max >= 3

    def features(self, transaction_version: int, epoch: int) -> None:
        """The cluster's finalized `transaction.version` from the ApiVersions answer with the
        highest epoch (0 when the brokers lack the V2 request versions); it takes effect at
        the next transaction boundary (`_choose_version`)."""
        if epoch > self._features_epoch:
            self._finalized_tv, self._features_epoch = transaction_version, epoch

    def _choose_version(self) -> bool:
        """Java's maybeUpdateTransactionV2Enabled; True when V1 gave way to V2 (Java's
        clientSideEpochBumpRequired: the first V2 transaction must start on a fresh epoch)."""
        before = self.transaction_v2
        self.transaction_v2 = self.allow_v2 and self._finalized_tv >= 2
        return self.transaction_v2 and not before

    # ------------------------------------------------------------------ user calls

    def init_transactions(self, keep_prepared_txn: bool = False,
                          expected: tuple[int, int] | None = None) -> TxnResult:
        """`expected` (producer id, epoch): take over the id only if that is its current (or, for
        a retry, previous) producer id and epoch, else PRODUCER_FENCED (InitProducerId v3+'s
        fields, KIP-360): how one process of a writer that several processes share (the Spark
        sink's driver) goes on where another initialized it, and a zombie that a newer
        InitProducerId replaced cannot."""
        resumed = self._resume("init_transactions")
        if resumed is not None:
            return resumed
        self._raise_if_error()
        self._expected = expected
        if keep_prepared_txn and not self.two_phase_commit:
            raise TransactionStateError("init_transactions(keep_prepared_txn=True) needs "
                                        "transaction.two.phase.commit.enable=true")
        self._transition(S.INITIALIZING, "init_transactions")
        self._keep_prepared = keep_prepared_txn
        result = TxnResult("init_transactions")
        self._enqueue(_Pending(_INIT, next(self._seq), result, self._txn_coordinator()))
        return self._started(result)

    def resume_transaction(self, producer_id: int, producer_epoch: int) -> None:
        """Take over the open transaction that another producer of this transactional.id
        started at (producer_id, producer_epoch), only to end it: `commit_transaction` or
        `abort_transaction` then send EndTxn with that id and epoch. Flink's
        `FlinkKafkaInternalProducer.resumeTransaction` does the same for its recovery; KIP-939's
        `completeTransaction` is the official form, which no Kafka release has. No
        InitProducerId is sent (it would bump the epoch and abort the transaction), and nothing
        may be sent in the transaction (its sequences are the other producer's); the producer
        is good for that one EndTxn only. For a process that completes transactions other
        processes prepared (the Spark sink's driver), not for applications.

        The coordinator answers a commit that already completed at this epoch with NONE (a
        retry); a transaction aborted meanwhile gives INVALID_TXN_STATE, a newer epoch (a later
        InitProducerId, the timeout sweeper) PRODUCER_FENCED: both fatal, raised by the call."""
        if self.state is not S.UNINITIALIZED:
            raise TransactionStateError(
                f"resume_transaction: only on a new producer, not in state {self.state.name}")
        if producer_id < 0 or producer_epoch < 0:
            raise ValueError("resume_transaction needs the transaction's producer id and epoch")
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self._resumed = True
        self._transaction_started = True   # EndTxn must be sent: the coordinator holds it
        log.debug("transaction state %s -> %s (resumed at producer id %d epoch %d)",
                  self.state.name, S.IN_TRANSACTION.name, producer_id, producer_epoch)
        self.state = S.IN_TRANSACTION

    def begin_transaction(self) -> None:
        self._resume("begin_transaction")
        self._raise_if_error()
        if self._resumed:
            raise TransactionStateError("a producer that resumed a transaction only ends it")
        self._transition(S.IN_TRANSACTION, "begin_transaction")

    def maybe_add_partition(self, tp: TopicPartition) -> None:
        """Before a record for `tp` is queued (Java's maybeAddPartition): the partition joins the
        next AddPartitionsToTxn. Raises if the producer may not send now."""
        self.check_send(f"{tp.topic}-{tp.partition}")
        if self.transaction_v2:
            # its leader adds it when the batch arrives (Produce v12+): drained at once, and the
            # transaction has begun as far as the client can know (EndTxn must be sent)
            self._partitions.add(tp)
            self._transaction_started = True
        elif tp not in self._partitions and tp not in self._pending_partitions:
            self._new_partitions.add(tp)

    def open_for_records(self) -> bool:
        """True when `check_send` would pass: read without the lock on the caller's per-record
        path, which then skips `check_send`. A record let through by a stale answer is checked
        again when the loop takes it (`maybe_add_partition`) and fails there."""
        call = self._call
        return (self.state is S.IN_TRANSACTION and (call is None or call.done)
                and self.producer_id >= 0 and not self._resumed)

    def check_send(self, what: str = "a topic") -> None:
        """Raises unless a record may be sent now (the shell asks before it takes a record,
        the partition it goes to being chosen later)."""
        self._resume("send")
        self._raise_if_error()
        if self._resumed:
            raise TransactionStateError(f"cannot send to {what}: a resumed transaction is only "
                                        "committed or aborted")
        if self.producer_id < 0:
            raise TransactionStateError(
                f"cannot send to {what} before init_transactions completed")
        if self.state is not S.IN_TRANSACTION:
            raise TransactionStateError(
                f"cannot send to {what} in state {self.state.name}: begin_transaction first")

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
                                    group_metadata: ConsumerGroupMetadata) -> TxnResult:
        """AddOffsetsToTxn to the transaction coordinator, then TxnOffsetCommit (with KIP-447's
        member data) to the group coordinator; resolves when both succeeded."""
        # Not resumable (Java's sendOffsetsToTransaction either): a second call sends again,
        # which the coordinators accept; a pending init/commit/abort makes it illegal.
        self._resume("send_offsets_to_transaction")
        self._raise_if_error()
        if self.state is not S.IN_TRANSACTION:
            raise TransactionStateError(
                f"cannot send offsets in state {self.state.name}: no transaction in progress")
        result = TxnResult("send_offsets_to_transaction")
        positions = {tp.key: (o if isinstance(o, OffsetAndMetadata) else OffsetAndMetadata(o))
                     for tp, o in offsets.items()}
        if self.transaction_v2:
            # TxnOffsetCommit v5 straight to the group's coordinator, which adds its partition
            self._transaction_started = True
            self._enqueue(_Pending(_ADD, next(self._seq), result,
                                   (CoordinatorType.GROUP, group_metadata.group_id),
                                   group=group_metadata, offsets=positions, offset_commit=True))
        else:
            self._enqueue(_Pending(_ADD, next(self._seq), result, self._txn_coordinator(),
                                   group=group_metadata, offsets=positions))
        return result

    def prepare_transaction(self) -> PreparedTxnState:
        """KIP-939's prepareTransaction, once the shell flushed every record of the transaction
        (and any offsets call resolved): the transaction stays open, the coordinator never aborts
        it by timeout, and only `complete_transaction` (or commit/abort) may follow."""
        self._raise_if_error()
        if not self.two_phase_commit:
            raise TransactionStateError("prepare_transaction needs transaction.two.phase.commit.enable=true")
        if self.state is not S.IN_TRANSACTION:
            raise TransactionStateError(f"prepare_transaction: not in a transaction (state {self.state.name})")
        if self._has_incomplete() or self._pending_partitions or self._new_partitions or \
                any(e.find is None for e in self._queue) or self._in_flight is not None:
            raise TransactionStateError("prepare_transaction: records or requests of the transaction "
                                        "are still in flight (flush first)")
        self._transition(S.PREPARED_TRANSACTION, "prepare_transaction")
        self.prepared = PreparedTxnState(self.producer_id, self.producer_epoch)
        if not self._transaction_started:
            self.prepared = PreparedTxnState()   # nothing was added: nothing for the coordinator to keep
        return self.prepared

    def complete_transaction(self, state: PreparedTxnState) -> tuple[bool | None, TxnResult]:
        """KIP-939's completeTransaction: commit the prepared (or kept) transaction if `state`
        names it, else abort it. (True, result) for a commit, (False, result) for an abort (logged
        as a warning: the manager's record and the log disagree), (None, done result) when no
        transaction is open (it was completed before the manager crashed, or never prepared)."""
        resumed = self._resume("complete_transaction")
        if resumed is not None:
            return self._completing, resumed
        self._raise_if_error()
        if self.state is S.READY and self.prepared is None:
            done = TxnResult("complete_transaction")
            done._resolve(None)
            return None, done
        if self.state is not S.PREPARED_TRANSACTION or self.prepared is None:
            raise TransactionStateError(f"complete_transaction: no prepared transaction (state {self.state.name})")
        commit = state == self.prepared and state.has_transaction
        if not commit:
            log.warning("transactional.id %r: the recorded state %r does not match the open transaction "
                        "%r: aborting it", self.transactional_id, str(state), str(self.prepared))
        self._completing = commit
        self.prepared = None
        if not self._transaction_started:   # prepared with nothing in it
            self._transition(S.COMMITTING_TRANSACTION if commit else S.ABORTING_TRANSACTION)
            result = TxnResult("complete_transaction")
            self._complete_transaction(result)
            return commit, result
        self._transition(S.COMMITTING_TRANSACTION if commit else S.ABORTING_TRANSACTION, "complete_transaction")
        result = self._end_transaction(commit)
        result.operation = "complete_transaction"
        return commit, self._started(result)

    def commit_transaction(self) -> TxnResult:
        resumed = self._resume("commit_transaction")
        if resumed is not None:
            return resumed
        self._raise_if_error()
        self.prepared = None
        self._transition(S.COMMITTING_TRANSACTION, "commit_transaction")
        return self._started(self._end_transaction(True))

    def abort_transaction(self) -> TxnResult:
        resumed = self._resume("abort_transaction")
        if resumed is not None:
            return resumed
        if self.state is not S.ABORTABLE_ERROR:
            self._raise_if_error()
        cause = self.last_error
        self.prepared = None
        self._transition(S.ABORTING_TRANSACTION, "abort_transaction")
        self._new_partitions.clear()   # nothing more joins a transaction being aborted
        # The coordinator does not know our producer id: it would refuse EndTxn, and the bump
        # that follows aborts whatever it had (Java skips EndTxn for InvalidPidMapping too).
        skip = getattr(cause, "code", None) == E.INVALID_PRODUCER_ID_MAPPING
        return self._started(self._end_transaction(False, skip))

    def close(self, error: BaseException | None = None) -> None:
        """The producer closes: unresolved calls fail, nothing more is sent."""
        if self.state is not S.FATAL_ERROR:
            self._producer_failed = True   # the producer's own close fails its records
            self._fatal(error or TransactionFatalError("the producer was closed"),
                        quiet=error is None)

    # ------------------------------------------------------------------ what the sender asks

    def may_send(self, tp: TopicPartition) -> bool:
        """Java's isSendToPartitionAllowed: only partitions the coordinator added."""
        return self.state is not S.FATAL_ERROR and tp in self._partitions

    def partitions_to_add(self) -> frozenset[TopicPartition]:
        """Partitions with records waiting for AddPartitionsToTxn (asked or not yet)."""
        return frozenset(self._new_partitions | self._pending_partitions)

    def has_pending_requests(self) -> bool:
        return bool(self._queue) or self._in_flight is not None

    def next_wake_ms(self, now_ms: int) -> int | None:
        """When a queued request becomes due (after a backoff), if none is due now."""
        if self._in_flight is not None or not self._queue or self.state is S.FATAL_ERROR:
            return None
        head = min(self._queue, key=_order)
        return head.not_before_ms if head.not_before_ms > now_ms else None

    def next_request(self, now_ms: int) -> Outgoing | None:
        """The next request to send, or None. At most one is in flight."""
        self._sync_producer()
        if self.state is S.FATAL_ERROR or self._in_flight is not None:
            return None
        if self._new_partitions and self.state in (S.IN_TRANSACTION, S.COMMITTING_TRANSACTION):
            self._queue_add_partitions()
        while self._queue:
            entry = min(self._queue, key=_order)
            if entry.not_before_ms > now_ms:
                return None
            if entry.priority >= _END and self._has_incomplete():
                return None   # EndTxn (and the bump after it) once every batch has an outcome
            if entry.priority == _END and (entry.skip or not self._transaction_started):
                self._queue.remove(entry)   # nothing was added: the coordinator has nothing to end
                assert entry.result is not None  # an EndTxn entry carries the caller's result
                self._complete_transaction(entry.result)
                continue
            node = None
            if entry.coordinator is not None:
                node = self._coordinators.get(entry.coordinator)
                if node is None:
                    self._lookup(entry.coordinator)
                    continue
            self._queue.remove(entry)
            self._in_flight = entry
            self._in_flight_request = self._build(entry)
            return Outgoing(self._in_flight_request, node)
        return None

    # ------------------------------------------------------------------ answers

    def on_response(self, response: object, now_ms: int) -> None:
        entry, request = self._in_flight, self._in_flight_request
        if entry is None or not isinstance(response, _RESPONSE_OF[type(request)]):
            raise TransactionStateError(f"{type(response).__name__} does not answer the request "
                                        f"in flight ({type(request).__name__})")
        self._in_flight = self._in_flight_request = None
        if self.state is S.FATAL_ERROR:
            return   # its result failed with the fatal error already
        r: Any = response  # its type matches the request's (checked above)
        if isinstance(request, FindCoordinatorRequest):
            self._on_find_coordinator(entry, r, now_ms)
        elif isinstance(request, InitProducerIdRequest):
            self._on_init_producer_id(entry, r, now_ms)
        elif isinstance(request, AddPartitionsToTxnRequest):
            self._on_add_partitions(entry, r, now_ms)
        elif isinstance(request, AddOffsetsToTxnRequest):
            self._on_add_offsets(entry, r, now_ms)
        elif isinstance(request, TxnOffsetCommitRequest):
            self._on_txn_offset_commit(entry, r, now_ms)
        else:
            self._on_end_txn(entry, r, now_ms)
        if self.state is S.FATAL_ERROR and entry.result is not None and not entry.result.done:
            entry.result._resolve(self.last_error)   # the answer that made the producer fail

    def on_request_failed(self, now_ms: int) -> None:
        """No answer (disconnected, timed out): find the coordinator again and resend the same
        request, whose retry the coordinator recognises (EndTxn in Complete* answers NONE)."""
        entry = self._in_flight
        if entry is None:
            return
        self._in_flight = self._in_flight_request = None
        if self.state is S.FATAL_ERROR:
            return
        if entry.coordinator is not None:
            self._lookup(entry.coordinator)
        self._retry(entry, now_ms)

    # ------------------------------------------------------------------ from the producer core

    def on_batch_failed(self, tp: TopicPartition, error: BaseException) -> None:
        """A batch of the transaction failed for good: the transaction cannot commit."""
        if self.state is S.FATAL_ERROR or isinstance(error, TransactionAbortedError):
            return
        code = getattr(error, "code", None)
        if code in _FATAL_BATCH or isinstance(error, ProducerFatalError):
            self._producer_failed = isinstance(error, ProducerFatalError)  # it knows already
            self._fatal(_fatal_error(code, f"{tp.topic}-{tp.partition}: {error}")
                        if code is not None else error)
            return
        # Its sequence may be in the log or not: only a new epoch makes the partition's
        # sequences certain again (Java bumps after any failed batch when it can; under V2 the
        # abort's EndTxn bumps it).
        if self.epoch_bump_supported and not self.transaction_v2:
            self._epoch_bump_required = True
        self._abortable(TransactionAbortableError(
            f"{tp.topic}-{tp.partition}: a batch of the transaction failed: {error}",
            E.UNKNOWN_SERVER_ERROR if code is None else code), cause=error)

    def on_sequence_gap(self, tp: TopicPartition, reason: str) -> None:
        """The partition's sequences cannot continue in this epoch (Java's maybeResolveSequences):
        abortable if the coordinator can bump the epoch, fatal otherwise."""
        if self.state is S.FATAL_ERROR:
            return
        msg = f"{tp.topic}-{tp.partition}: {reason}"
        if self.transaction_v2 or self.epoch_bump_supported:
            if not self.transaction_v2:   # under V2 the abort's EndTxn bumps
                self._epoch_bump_required = True
            self._abortable(TransactionAbortableError(
                msg + ": abort the transaction to continue", E.OUT_OF_ORDER_SEQUENCE_NUMBER))
        else:
            self._fatal(TransactionFatalError(
                msg + ": the coordinator cannot bump the epoch (InitProducerId < v3)",
                E.OUT_OF_ORDER_SEQUENCE_NUMBER))

    # ------------------------------------------------------------------ response handlers

    def _on_find_coordinator(self, entry: _Pending, r: FindCoordinatorResponse, now_ms: int) -> None:
        assert entry.find is not None  # a FindCoordinator entry names what it looks up
        code = r.error_code
        key_type, key = entry.find
        if code == E.NONE:
            log.info("%s coordinator for %r is node %d", CoordinatorType(key_type).name.lower(),
                     key, r.node_id)
            self._coordinators[entry.find] = r.node_id
        elif code in RETRIABLE:
            self._retry(entry, now_ms)
        elif code == E.GROUP_AUTHORIZATION_FAILED:
            self._abortable(TransactionAbortableError(f"not authorized for group {key!r}", code))
        elif code == E.TRANSACTION_ABORTABLE:
            self._abortable(TransactionAbortableError("FindCoordinator: TRANSACTION_ABORTABLE", code))
        else:
            self._fatal(_fatal_error(code, f"FindCoordinator({key!r})"))

    def _on_init_producer_id(self, entry: _Pending, r: InitProducerIdResponse, now_ms: int) -> None:
        assert entry.result is not None and entry.coordinator is not None  # made with both
        code = r.error_code
        if code == E.NONE:
            log.info("transactional.id %r: producer id %d epoch %d", self.transactional_id,
                     r.producer_id, r.producer_epoch)
            self.producer_id, self.producer_epoch = r.producer_id, r.producer_epoch
            self._epoch_bump_required = False
            if self._producer is not None:
                self._producer.start_epoch(r.producer_id, r.producer_epoch)
            self._choose_version()
            if self._keep_prepared and r.ongoing_producer_id >= 0:
                # KIP-939: the coordinator kept an open transaction; only completing it may follow
                log.info("transactional.id %r: kept the open transaction of producer id %d epoch %d",
                         self.transactional_id, r.ongoing_producer_id, r.ongoing_producer_epoch)
                self.prepared = PreparedTxnState(r.ongoing_producer_id, r.ongoing_producer_epoch)
                self._transaction_started = True
                self._transition(S.PREPARED_TRANSACTION)
            else:
                self.prepared = None
                self._transition(S.READY)
            self._keep_prepared = False
            entry.result._resolve(None)
        elif code in _COORDINATOR_MOVED:
            self._lookup(entry.coordinator)
            self._retry(entry, now_ms)
        elif code in RETRIABLE:   # CONCURRENT_TRANSACTIONS while the coordinator fences/aborts
            self._retry(entry, now_ms)
        elif code == E.TRANSACTION_ABORTABLE:
            self._abortable(TransactionAbortableError("InitProducerId: TRANSACTION_ABORTABLE", code),
                            entry)
        else:
            self._fatal(_fatal_error(code, "InitProducerId"))

    def _on_add_partitions(self, entry: _Pending, r: AddPartitionsToTxnResponse, now_ms: int) -> None:
        assert entry.coordinator is not None  # sent to the transaction coordinator
        unauthorized: set[str] = set()
        failed: dict[TopicPartition, int] = {}
        for tp in entry.partitions:
            code = r.results.get(tp, E.UNKNOWN_SERVER_ERROR)
            if code == E.NONE:
                continue
            if code in _COORDINATOR_MOVED:
                self._lookup(entry.coordinator)
                self._retry(entry, now_ms)
                return
            if code == E.CONCURRENT_TRANSACTIONS:
                self._retry(entry, now_ms, min(self.retry_backoff_ms, ADD_PARTITIONS_RETRY_BACKOFF_MS)
                            if not self._partitions else None)
                return
            if code in RETRIABLE:
                self._retry(entry, now_ms)
                return
            if code in _FATAL:
                self._fatal(_fatal_error(code, "AddPartitionsToTxn"))
                return
            if code in _NEEDS_BUMP:
                self._abortable_if_bump(code, "AddPartitionsToTxn")
                return
            if code == E.TRANSACTION_ABORTABLE:
                self._abortable(TransactionAbortableError("AddPartitionsToTxn: TRANSACTION_ABORTABLE",
                                                          code))
                return
            if code == E.TOPIC_AUTHORIZATION_FAILED:
                unauthorized.add(tp.topic)
            else:   # OPERATION_NOT_ATTEMPTED for the others, or unexpected
                failed[tp] = code
        # Whatever came of it, these are no longer pending: batches of added partitions that are
        # being retried must still be sendable during an abort.
        self._pending_partitions -= entry.partitions
        if unauthorized:
            self._abortable(TransactionAbortableError(
                f"not authorized to write to topics {sorted(unauthorized)}",
                E.TOPIC_AUTHORIZATION_FAILED))
        elif failed:
            names = {f"{tp.topic}-{tp.partition}": error_code(c).name for tp, c in failed.items()}
            code = next((c for c in failed.values() if c != E.OPERATION_NOT_ATTEMPTED),
                        E.OPERATION_NOT_ATTEMPTED)
            self._abortable(TransactionAbortableError(
                f"could not add partitions to the transaction: {names}", code))
        else:
            self._partitions |= entry.partitions
            self._transaction_started = True

    def _on_add_offsets(self, entry: _Pending, r: AddOffsetsToTxnResponse, now_ms: int) -> None:
        assert entry.group is not None and entry.coordinator is not None  # made with both
        code = r.error_code
        if code == E.NONE:
            self._transaction_started = True
            # the result resolves with the TxnOffsetCommit, sent to the group's coordinator
            entry.offset_commit = True
            entry.coordinator = (CoordinatorType.GROUP, entry.group.group_id)
            entry.not_before_ms = 0
            self._enqueue(entry)
        elif code in _COORDINATOR_MOVED:
            self._lookup(entry.coordinator)
            self._retry(entry, now_ms)
        elif code in RETRIABLE:
            self._retry(entry, now_ms)
        elif code in _NEEDS_BUMP:
            self._abortable_if_bump(code, "AddOffsetsToTxn", entry)
        elif code in (E.GROUP_AUTHORIZATION_FAILED, E.TRANSACTION_ABORTABLE):
            self._abortable(TransactionAbortableError(
                f"AddOffsetsToTxn({entry.group.group_id!r}): {error_code(code).name}", code), entry)
        else:   # fenced, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, INVALID_TXN_STATE, unexpected
            self._fatal(_fatal_error(code, "AddOffsetsToTxn"))

    def _on_txn_offset_commit(self, entry: _Pending, r: TxnOffsetCommitResponse, now_ms: int) -> None:
        assert entry.group is not None and entry.result is not None and entry.coordinator is not None
        moved = False
        for tp, code in r.results.items():
            if code == E.NONE:
                entry.offsets.pop(tp, None)
            elif code in _COORDINATOR_MOVED or code == E.REQUEST_TIMED_OUT:
                moved = True
            elif code in RETRIABLE:
                continue
            elif code in (E.GROUP_AUTHORIZATION_FAILED, E.FENCED_INSTANCE_ID, E.TRANSACTION_ABORTABLE,
                          E.UNKNOWN_MEMBER_ID, E.ILLEGAL_GENERATION):
                # a zombie member (KIP-447) or no rights: this transaction cannot commit
                self._abortable(TransactionAbortableError(
                    f"TxnOffsetCommit({entry.group.group_id!r}) {tp.topic}-{tp.partition}: "
                    f"{error_code(code).name}", code), entry)
                return
            else:   # fenced (INVALID_PRODUCER_EPOCH too), authorization, message format, other
                self._fatal(_fatal_error(code, "TxnOffsetCommit"))
                return
        if not entry.offsets:
            entry.result._resolve(None)
            return
        if moved:
            self._lookup(entry.coordinator)
        self._retry(entry, now_ms)

    def _on_end_txn(self, entry: _Pending, r: EndTxnResponse, now_ms: int) -> None:
        assert entry.result is not None and entry.coordinator is not None  # made with both
        code = r.error_code
        if code == E.NONE:
            if r.producer_id >= 0 and r.producer_epoch >= 0 and not self._resumed:
                # V2: the bumped epoch (a new id after an overflow); sequences start over
                log.debug("transactional.id %r goes on as producer id %d epoch %d", self.transactional_id,
                          r.producer_id, r.producer_epoch)
                self.producer_id, self.producer_epoch = r.producer_id, r.producer_epoch
                if self._producer is not None:
                    self._producer.start_epoch(r.producer_id, r.producer_epoch)
            self._complete_transaction(entry.result)
        elif code in _COORDINATOR_MOVED:
            self._lookup(entry.coordinator)
            self._retry(entry, now_ms)
        elif code in RETRIABLE:
            self._retry(entry, now_ms)
        elif code in _FATAL:
            self._fatal(_fatal_error(code, "EndTxn"))
        elif code in _NEEDS_BUMP or code == E.TRANSACTION_ABORTABLE:
            if self.state is S.ABORTING_TRANSACTION and self.epoch_bump_supported:
                # The coordinator has no transaction of ours to abort, or will not end it: the
                # bump aborts whatever it holds (InitProducerId fences an Ongoing transaction),
                # so the abort completes through it (Java would stay stuck in ABORTING).
                self._epoch_bump_required = True
                self._complete_transaction(entry.result)
            elif code == E.TRANSACTION_ABORTABLE:
                self._abortable(TransactionAbortableError("EndTxn: TRANSACTION_ABORTABLE", code), entry)
            else:
                self._abortable_if_bump(code, "EndTxn", entry)
        else:
            self._fatal(_fatal_error(code, "EndTxn"))

    # ------------------------------------------------------------------ internals

    def _complete_transaction(self, result: TxnResult) -> None:
        self._transaction_started = False
        self._partitions.clear()
        self._pending_partitions.clear()
        self._new_partitions.clear()
        if self._choose_version() and self.epoch_bump_supported and self.producer_id >= 0 and not self._resumed:
            self._epoch_bump_required = True   # V1 gave way to V2: the first V2 transaction on a fresh epoch
        if self._epoch_bump_required and self.state in (S.ABORTING_TRANSACTION, S.COMMITTING_TRANSACTION):
            # KIP-360: InitProducerId with the current id/epoch; the call resolves with it
            self._transition(S.INITIALIZING)
            self._enqueue(_Pending(_BUMP, next(self._seq), result, self._txn_coordinator()))
            return
        self._transition(S.READY if self.producer_id >= 0 else S.UNINITIALIZED)
        result._resolve(None)

    def _end_transaction(self, committed: bool, skip: bool = False) -> TxnResult:
        result = TxnResult("commit_transaction" if committed else "abort_transaction")
        self._enqueue(_Pending(_END, next(self._seq), result, self._txn_coordinator(),
                               committed=committed, skip=skip))
        return result

    def _queue_add_partitions(self) -> None:
        queued = next((e for e in self._queue if e.priority == _ADD and e.find is None
                       and e.group is None), None)
        if queued is None:
            queued = _Pending(_ADD, next(self._seq), None, self._txn_coordinator())
            self._enqueue(queued)
        queued.partitions |= self._new_partitions
        self._pending_partitions |= self._new_partitions
        self._new_partitions.clear()

    def _build(self, e: _Pending) -> object:
        tid, pid, epoch = self.transactional_id, self.producer_id, self.producer_epoch
        if e.find is not None:
            return FindCoordinatorRequest(int(e.find[0]), e.find[1])
        if e.priority == _INIT:
            xpid, xepoch = self._expected if self._expected is not None else (-1, -1)
            return InitProducerIdRequest(tid, self.transaction_timeout_ms, xpid, xepoch,
                                         enable_2pc=self.two_phase_commit, keep_prepared_txn=self._keep_prepared)
        if e.priority == _BUMP:
            return InitProducerIdRequest(tid, self.transaction_timeout_ms, pid, epoch,
                                         enable_2pc=self.two_phase_commit)
        if e.priority == _END:
            if self._resumed:   # never initialized: the cluster's version now
                self._choose_version()
            return EndTxnRequest(tid, pid, epoch, bool(e.committed), self.transaction_v2)
        if e.group is None:
            return AddPartitionsToTxnRequest(tid, pid, epoch, tuple(sorted(e.partitions)))
        g = e.group
        if not e.offset_commit:
            return AddOffsetsToTxnRequest(tid, pid, epoch, g.group_id)
        return TxnOffsetCommitRequest(tid, g.group_id, pid, epoch, g.generation_id, g.member_id,
                                      g.group_instance_id, tuple(sorted(e.offsets.items())), self.transaction_v2)

    def _txn_coordinator(self) -> tuple[int, str]:
        return (CoordinatorType.TRANSACTION, self.transactional_id)

    def _enqueue(self, entry: _Pending) -> None:
        self._queue.append(entry)

    def _retry(self, entry: _Pending, now_ms: int, backoff_ms: int | None = None) -> None:
        entry.not_before_ms = now_ms + (self.retry_backoff_ms if backoff_ms is None else backoff_ms)
        self._enqueue(entry)   # keeps its seq: still ahead of later requests of its priority

    def _lookup(self, coordinator: tuple[int, str]) -> None:
        """Forget the coordinator and ask for it again (once)."""
        self._coordinators.pop(coordinator, None)
        if any(e.find == coordinator for e in self._queue) or (
                self._in_flight is not None and self._in_flight.find == coordinator):
            return
        self._enqueue(_Pending(_FIND, next(self._seq), find=coordinator))

    def _has_incomplete(self) -> bool:
        return self._producer is not None and self._producer.has_incomplete()

    def _sync_producer(self) -> None:
        """Tell the producer core what the state means for its batches. Done here, from the
        sender's loop, and not inside the producer's callbacks, which must not re-enter it."""
        p = self._producer
        if p is None:
            return
        if self.state is S.FATAL_ERROR:
            if not self._producer_failed:
                self._producer_failed = True
                assert self.last_error is not None  # set with FATAL_ERROR
                p.go_fatal(self.last_error)
        elif self.state in (S.ABORTABLE_ERROR, S.ABORTING_TRANSACTION) and p.has_incomplete():
            p.abort_undrained(TransactionAbortedError(
                "the transaction was aborted before the record was sent"
                + (f": {self.last_error}" if self.last_error is not None else "")))

    def _started(self, result: TxnResult) -> TxnResult:
        self._call = result
        return result

    def _resume(self, operation: str) -> TxnResult | None:
        """The unresolved result of the same call made before (its caller gave up waiting);
        a different call meanwhile is illegal (Java's pending transition)."""
        call = self._call
        if call is None or call.done:
            self._call = None
            return None
        if call.operation == operation:
            return call
        raise TransactionStateError(f"cannot {operation}: the previous call to {call.operation} "
                                    f"has not completed and must be retried")

    def _raise_if_error(self) -> None:
        err = self.last_error
        if self.state is S.ABORTABLE_ERROR:
            raise TransactionAbortableError(
                f"the transaction must be aborted: {err}", getattr(err, "code", -1)) from err
        if self.state is S.FATAL_ERROR:
            cls = type(err) if isinstance(err, TransactionFatalError) else TransactionFatalError
            raise cls(f"the transactional producer failed: {err}", getattr(err, "code", -1)) from err

    def _transition(self, target: TxnState, operation: str | None = None,
                    error: BaseException | None = None) -> None:
        if self.state not in VALID_PREVIOUS[target]:
            raise TransactionStateError(
                f"{operation or 'transition'}: not allowed in state {self.state.name} "
                f"(transactional.id {self.transactional_id!r})")
        log.debug("transaction state %s -> %s", self.state.name, target.name)
        self.state = target
        self.last_error = error

    def _abortable(self, error: TransactionAbortableError, entry: _Pending | None = None,
                   cause: BaseException | None = None) -> None:
        if cause is not None:
            error.__cause__ = cause
        if entry is not None and entry.result is not None and not entry.result.done:
            entry.result._resolve(error)
        if self.state is S.ABORTING_TRANSACTION or self.state is S.FATAL_ERROR:
            return   # the abort under way settles it (Java skips this transition too)
        if self.state not in VALID_PREVIOUS[S.ABORTABLE_ERROR]:
            log.warning("ignoring an abortable error in state %s: %s", self.state.name, error)
            return
        log.info("transaction must be aborted: %s", error)
        self._transition(S.ABORTABLE_ERROR, error=error)
        # Requests not yet sent would fail anyway; their callers learn it now. A FindCoordinator
        # may still go: the abort needs the coordinator.
        for e in [e for e in self._queue if e.find is None]:
            self._queue.remove(e)
            if e.result is not None:
                e.result._resolve(error)

    def _abortable_if_bump(self, code: int, what: str, entry: _Pending | None = None) -> None:
        """UNKNOWN_PRODUCER_ID / INVALID_PRODUCER_ID_MAPPING: recoverable by a new epoch only
        (under V2 the abort's EndTxn gives one, unless the coordinator lost the producer id)."""
        msg = f"{what}: {error_code(code).name}"
        if self.transaction_v2 and code == E.UNKNOWN_PRODUCER_ID:
            self._abortable(TransactionAbortableError(msg, code), entry)
        elif self.epoch_bump_supported:
            self._epoch_bump_required = True
            self._abortable(TransactionAbortableError(msg, code), entry)
        else:
            self._fatal(TransactionFatalError(msg, code))

    def _fatal(self, error: BaseException, quiet: bool = False) -> None:
        if self.state is S.FATAL_ERROR:
            return
        if not quiet:   # an ordinary close is no failure worth an error line
            log.error("transactional producer %r failed: %s", self.transactional_id, error)
        self._transition(S.FATAL_ERROR, error=error)
        pending = [e.result for e in self._queue if e.result is not None]
        if self._in_flight is not None and self._in_flight.result is not None:
            pending.append(self._in_flight.result)
        self._queue.clear()
        for r in pending:
            if not r.done:
                r._resolve(error)


def _order(e: _Pending) -> tuple[int, int]:
    return (e.priority, e.seq)


def _fatal_error(code: int | None, what: str) -> KafkaClientError:
    name = error_code(code).name if code is not None else "error"
    if code in _FENCED:
        return ProducerFencedError(f"{what}: {name}: another producer with this transactional.id "
                                   f"has a newer epoch", E.PRODUCER_FENCED)
    return TransactionFatalError(f"{what}: {name}", -1 if code is None else code)
