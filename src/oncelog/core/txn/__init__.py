"""Transactions, the pure parts (docs/transactions.md): the coordinator's state machine and its
`__transaction_state` records (`coordinator`, `state`, `log_format`), the error codes per version
(`errors`), the marker bookkeeping (`markers`), a partition's open transactions, last stable
offset and aborted-transaction index (`partition`), and the read_committed filter
(`read_committed`).
"""
from oncelog.core.producer_epoch import is_epoch_exhausted
from oncelog.core.txn.coordinator import (
                                          ABORT,
                                          COMMIT,
                                          Answer,
                                          Completion,
                                          CoordinatorInvariantError,
                                          MarkerJob,
                                          TransactionCoordinator,
                                          Transition,
                                          TxnConfig,
)
from oncelog.core.txn.partition import (
                                          AbortedQuery,
                                          AbortedTxn,
                                          AbortedTxnIndex,
                                          CompletedTxn,
                                          PartitionTxns,
                                          collect_aborted,
)
from oncelog.core.txn.read_committed import ReadCommittedFilter
from oncelog.core.txn.state import VALID_PREVIOUS, TopicPartition, TransactionMetadata, TxnState

__all__ = ["ABORT", "COMMIT", "Answer", "Completion", "CoordinatorInvariantError", "MarkerJob",
           "Transition", "TransactionCoordinator", "TxnConfig", "AbortedQuery", "AbortedTxn",
           "AbortedTxnIndex", "CompletedTxn", "PartitionTxns", "collect_aborted", "ReadCommittedFilter",
           "VALID_PREVIOUS", "TopicPartition", "TransactionMetadata", "TxnState", "is_epoch_exhausted"]
