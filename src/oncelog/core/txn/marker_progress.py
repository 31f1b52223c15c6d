"""The marker writer's bookkeeping: which partitions of a MarkerJob still need their marker, and
what a partition's answer means (Kafka's TransactionMarkerRequestCompletionHandler).

The writer itself (`broker/txn/marker_writer.py`) owns connections and timers; this decides.
"""
from __future__ import annotations

from enum import Enum

from oncelog.core.txn.coordinator import MarkerJob
from oncelog.core.txn.state import TopicPartition
from oncelog.protocol.errors import ErrorCode

E = ErrorCode


class MarkerOutcome(Enum):
    DONE = "done"              # this partition needs no more marker
    RETRY = "retry"            # send again after backoff, to the partition's current leader
    STOP = "stop"              # a newer producer epoch or coordinator owns the id: drop the job
    UNEXPECTED = "unexpected"  # a bug on one side: log it, and retry like RETRY


_DONE = frozenset({E.NONE, E.UNSUPPORTED_FOR_MESSAGE_FORMAT, E.UNSUPPORTED_VERSION})
_RETRY = frozenset({E.UNKNOWN_TOPIC_OR_PARTITION, E.NOT_LEADER_OR_FOLLOWER, E.NOT_ENOUGH_REPLICAS,
                    E.NOT_ENOUGH_REPLICAS_AFTER_APPEND, E.REQUEST_TIMED_OUT, E.KAFKA_STORAGE_ERROR,
                    E.NETWORK_EXCEPTION, E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE,
                    E.NOT_COORDINATOR})
_STOP = frozenset({E.INVALID_PRODUCER_EPOCH, E.TRANSACTION_COORDINATOR_FENCED})


def classify(code: int) -> MarkerOutcome:
    if code in _DONE:
        return MarkerOutcome.DONE
    if code in _RETRY:
        return MarkerOutcome.RETRY
    if code in _STOP:
        return MarkerOutcome.STOP
    return MarkerOutcome.UNEXPECTED


class MarkerProgress:
    """One job's partitions still waiting for an acknowledged marker."""

    __slots__ = ("job", "left", "stopped")

    def __init__(self, job: MarkerJob) -> None:
        self.job = job
        self.left: set[TopicPartition] = set(job.partitions)
        self.stopped = False

    def on_result(self, tp: TopicPartition, code: int) -> MarkerOutcome:
        outcome = classify(code)
        if outcome is MarkerOutcome.DONE:
            self.left.discard(tp)
        elif outcome is MarkerOutcome.STOP:
            self.stopped = True
        return outcome

    def on_partition_gone(self, tp: TopicPartition) -> None:
        """The partition's topic was deleted: no marker can or need be written there."""
        self.left.discard(tp)

    @property
    def finished(self) -> bool:
        """Every marker acknowledged: append `job.completion` now."""
        return not self.left and not self.stopped
