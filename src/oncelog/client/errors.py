"""Errors the client raises to the application."""
from __future__ import annotations

from oncelog.core.topic_config import ConfigError
from oncelog.protocol.errors import KafkaProtocolError, error_code


class KafkaClientError(Exception):
    """Base class of client-side errors.

    `possibly_written`, on the error a record's delivery failed with: True when the producer sent
    the record and gave up without knowing whether the broker appended it (delivery timeout or
    retries used up while an answer was missing, close with the request on the wire): it may be in
    the log, at most once and in its order, or not. False: it is not in the log (never sent, or
    refused by the broker on every attempt)."""

    possibly_written = False


class BufferExhaustedError(KafkaClientError):
    """`buffer.memory` is full and did not free up within `max.block.ms`."""


class ProducerFatalError(KafkaClientError):
    """The producer cannot continue (fenced, data loss detected); close it and inspect the log."""


class DataLossError(ProducerFatalError):
    """The broker no longer has records it acknowledged (OutOfOrderSequence / UnknownProducerId
    that retention does not explain). Names the partition and offsets involved."""

    def __init__(self, topic: str, partition: int, message: str) -> None:
        self.topic = topic
        self.partition = partition
        super().__init__(f"{topic}-{partition}: {message}")


class IdempotenceUnsupportedError(ProducerFatalError):
    """`enable.idempotence=required` but the broker or the topic's message format cannot do it."""


class AuthorizationError(ProducerFatalError):
    """The principal lacks the ACL the request needs (CLUSTER_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Java's ClusterAuthorizationException and
    TransactionalIdAuthorizationException); `code` is the Kafka error."""

    def __init__(self, code: int, message: str) -> None:
        self.code = error_code(code)
        super().__init__(message)


class DeliveryTimeoutError(KafkaClientError):
    """A record was not acknowledged within `delivery.timeout.ms`."""


class BrokerResponseError(KafkaClientError):
    """The broker answered with a non-retriable error code (or retries ran out)."""

    def __init__(self, code: int, message: str | None = None) -> None:
        self.code = error_code(code)
        name = self.code.name
        super().__init__(f"{name}: {message}" if message else name)


__all__ = ["KafkaClientError", "ConfigError", "BufferExhaustedError", "ProducerFatalError",
           "DataLossError", "IdempotenceUnsupportedError", "AuthorizationError", "DeliveryTimeoutError",
           "BrokerResponseError", "KafkaProtocolError"]


class ProducerClosedError(KafkaClientError):
    """The producer was closed; records still queued were not sent."""


class RecordTooLargeError(KafkaClientError, ValueError):
    """A record is larger than `max.request.size`."""


# ---------------------------------------------------------------- transactions (confluent-kafka's
# classes of error: `txn_requires_abort()` for abortable, `fatal()` for the rest; Kafka's names)

class TransactionStateError(KafkaClientError):
    """A transactional method called in a state that does not allow it (Java's
    IllegalStateException): the transaction is unchanged, the call may be made later."""


class TransactionAbortableError(KafkaClientError):
    """The current transaction cannot commit; `abort_transaction()` and start a new one.
    `code` is the Kafka error behind it (UNKNOWN_SERVER_ERROR if it was not an error code)."""

    def __init__(self, message: str, code: int = -1) -> None:
        self.code = error_code(code)
        super().__init__(message)

    def txn_requires_abort(self) -> bool:
        return True


class TransactionFatalError(ProducerFatalError):
    """The transactional producer cannot continue (authorization, INVALID_TXN_STATE, an
    unsupported broker, an unexpected answer): close it."""

    def __init__(self, message: str, code: int = -1) -> None:
        self.code = error_code(code)
        super().__init__(message)

    def txn_requires_abort(self) -> bool:
        return False


class ProducerFencedError(TransactionFatalError):
    """Another producer with the same `transactional.id` (a newer epoch) took over."""


class TransactionTimeoutError(KafkaClientError, TimeoutError):
    """A transactional call did not complete within its timeout. It goes on in the background:
    make the same call again to wait for its outcome (confluent-kafka's retriable error)."""

    def retriable(self) -> bool:
        return True

    def txn_requires_abort(self) -> bool:
        return False


class TransactionAbortedError(KafkaClientError):
    """The record was never sent: its transaction was aborted first."""
