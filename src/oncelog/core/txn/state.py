"""The transaction coordinator's states and the metadata it keeps per transactional id.

Rule 1 of this package (h11's): every rule about which state may follow which lives in this file,
as data (`VALID_PREVIOUS`), so tests and docs can read it. Kafka's `TransactionState` ids are the
persisted form; names are what DescribeTransactions and ListTransactions show.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# clientTransactionVersion: what a transaction's requests said (Kafka's TransactionVersion levels);
# only TV_2 changes the coordinator's rules (an epoch bump at every EndTxn)
TV_0 = 0
TV_2 = 2
# KIP-939: a two-phase-commit transaction is persisted with this timeout (Kafka's Int.MaxValue,
# `TransactionMetadata.isDistributedTwoPhaseCommitTxn`), so a coordinator that loads it after a
# crash knows, from the record alone, never to abort it by timeout
TWO_PC_TIMEOUT_MS = 2**31 - 1

TopicPartition = tuple[str, int]


class TxnState(IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    # Pending-only: the fence and the abort it forces are written as one PrepareAbort record.
    PREPARE_EPOCH_FENCE = 7

    @property
    def display_name(self) -> str:
        return _NAMES[self]

    @classmethod
    def from_name(cls, name: str) -> TxnState | None:
        return _BY_NAME.get(name)


_NAMES = {
    TxnState.EMPTY: "Empty", TxnState.ONGOING: "Ongoing", TxnState.PREPARE_COMMIT: "PrepareCommit",
    TxnState.PREPARE_ABORT: "PrepareAbort", TxnState.COMPLETE_COMMIT: "CompleteCommit",
    TxnState.COMPLETE_ABORT: "CompleteAbort", TxnState.DEAD: "Dead",
    TxnState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
_BY_NAME = {name: state for state, name in _NAMES.items()}

S = TxnState
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    # + Empty and Complete*: Transactions V2 aborts from there (a client cannot know whether a
    # partition was added implicitly before a timeout, KAFKA-14563)
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}
PREPARED = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})
COMPLETED = frozenset({S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
# States in which an id may be expired (transactional.id.expiration.ms) or given a new epoch.
IDLE = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
# States a record may hold (Dead is a tombstone, PrepareEpochFence never written).
PERSISTED = frozenset({S.EMPTY, S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT,
                       S.COMPLETE_COMMIT, S.COMPLETE_ABORT})


def is_valid_transition(before: TxnState, after: TxnState) -> bool:
    return before in VALID_PREVIOUS[after]


@dataclass(frozen=True, slots=True)
class TransactionMetadata:
    """What `__transaction_state` holds for one transactional id (immutable: a transition makes a
    new one, and only the coordinator's `complete` installs it).

    `last_producer_id` is Kafka's previousProducerId (the id before the latest transition, so a
    client whose epoch-exhausted id was rotated can still be recognised); `last_producer_epoch`
    lets a retried InitProducerId (KIP-360) get the epoch it already bumped to.
    `next_producer_id` is set only in a Prepare* whose epoch bump overflowed (Transactions V2):
    its markers carry the old id at MAX_EPOCH, and Complete* moves to the new id at epoch 0.
    `client_transaction_version` is TV_2 for a transaction whose client speaks Transactions V2
    (its EndTxn retries are told apart by the bumped epoch).
    `ongoing_txn_epoch` (KIP-939): set while an Ongoing two-phase-commit transaction was kept by an
    InitProducerId(KeepPreparedTxn) that bumped the epoch to fence the crashed producer; it is the
    epoch the transaction was prepared at, which every later keep answers as
    OngoingTxnProducerEpoch (the external transaction manager compares it with what it recorded),
    however many restarts bump the epoch meanwhile.
    """
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition] = field(default_factory=frozenset)
    start_ms: int = -1
    update_ms: int = -1
    last_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    next_producer_id: int = NO_PRODUCER_ID
    client_transaction_version: int = TV_0
    ongoing_txn_epoch: int = NO_PRODUCER_EPOCH

    @property
    def two_phase(self) -> bool:
        """A KIP-939 transaction: never aborted by its timeout."""
        return self.timeout_ms == TWO_PC_TIMEOUT_MS

    def evolve(self, **changes: object) -> TransactionMetadata:
        return replace(self, **changes)  # type: ignore[arg-type]
