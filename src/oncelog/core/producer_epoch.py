"""Producer epochs: the int16 beside a producer id that a newer instance bumps to fence older ones.

One ceiling, Kafka's `Short.MAX_VALUE`, and the two rules Kafka builds on it:
- an idempotent producer bumps its own epoch (KIP-360) up to MAX_EPOCH itself, and asks for a new
  producer id when a bump would pass it (Kafka's `TransactionManager.bumpIdempotentProducerEpoch`):
  nothing else ever fences an idempotent producer, so its last epoch is usable;
- a transaction coordinator never gives a client MAX_EPOCH: an epoch at MAX_EPOCH - 1 is exhausted
  (`TransactionMetadata.isEpochExhausted`) and the next InitProducerId gets a new producer id, so
  that the coordinator can always fence the current holder with one more bump
  (`prepareFenceProducerEpoch` refuses to bump MAX_EPOCH).
"""
from __future__ import annotations

from oncelog.protocol.errors import ErrorCode

MAX_EPOCH = 2**15 - 1
EPOCH_EXHAUSTED_AT = MAX_EPOCH - 1
TV2 = 2   # `transaction.version` 2: the epoch is bumped at every EndTxn (core.txn.state.TV_2)


def can_bump_locally(epoch: int) -> bool:
    """Whether an idempotent producer at `epoch` may bump it itself; if not, it needs a new id."""
    return epoch < MAX_EPOCH


def is_epoch_exhausted(epoch: int) -> bool:
    """Whether a transactional producer at `epoch` must get a new producer id on its next
    InitProducerId (the coordinator keeps MAX_EPOCH for fencing)."""
    return epoch >= EPOCH_EXHAUSTED_AT


def marker_error(producer_id: int, current_epoch: int, current_coordinator_epoch: int, epoch: int,
                 coordinator_epoch: int, transaction_version: int = 0,
                 transaction_open: bool = False) -> tuple[int, str | None]:
    """Whether a partition takes a COMMIT/ABORT marker from a producer it knows at
    (`current_epoch`, `current_coordinator_epoch`) (Kafka's ProducerAppendInfo.appendEndTxnMarker):
    an epoch below the producer's is INVALID_PRODUCER_EPOCH, a coordinator epoch below the last one
    seen TRANSACTION_COORDINATOR_FENCED (a deposed coordinator's late marker). Data partitions
    and `__consumer_offsets` partitions alike (`core.txn.offsets`).

    A Transactions V2 marker (`transaction_version` >= 2, KIP-1228's WriteTxnMarkers v2) carries
    the epoch its coordinator bumped at EndTxn, and the producer's next transaction runs at that
    epoch: an equal epoch cannot tell this transaction's marker from a late one of the transaction
    before, so a V2 marker needs an epoch strictly above the producer's. Except an exact retry
    (KAFKA-19999): an equal epoch while the producer has no transaction open in the partition
    (`transaction_open` False) closes nothing and is taken, or a coordinator that lost the
    answer to its marker, or reloaded a Prepare*, would leave the transaction hanging."""
    if epoch < current_epoch:
        return (ErrorCode.INVALID_PRODUCER_EPOCH,
                f"marker epoch {epoch} is older than producer {producer_id}'s epoch {current_epoch}")
    if transaction_version >= TV2 and epoch == current_epoch and transaction_open:
        return (ErrorCode.INVALID_PRODUCER_EPOCH,
                f"Transactions V2 marker epoch {epoch} is not above producer {producer_id}'s epoch {current_epoch} "
                "of its open transaction: a late marker of the transaction before it")
    if coordinator_epoch < current_coordinator_epoch:
        return (ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                f"coordinator epoch {coordinator_epoch} is older than the last seen {current_coordinator_epoch}")
    return ErrorCode.NONE, None
