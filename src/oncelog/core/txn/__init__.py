"""Transactions, the pure parts (docs/transactions.md): the coordinator's state machine and its
`__transaction_state` records, the marker bookkeeping, the error codes per version, and the
partition side (open transactions, last stable offset, aborted-transaction index).
"""
from oncelog.core.txn.coordinator import (ABORT, COMMIT, Answer, Completion, CoordinatorInvariantError,
                                          MarkerJob, Transition, TransactionCoordinator, TxnConfig)
from oncelog.core.txn.state import (VALID_PREVIOUS, TopicPartition, TransactionMetadata, TxnState,
                                    is_epoch_exhausted)

__all__ = ["ABORT", "COMMIT", "Answer", "Completion", "CoordinatorInvariantError", "MarkerJob",
           "Transition", "TransactionCoordinator", "TxnConfig", "VALID_PREVIOUS", "TopicPartition",
           "TransactionMetadata", "TxnState", "is_epoch_exhausted"]
