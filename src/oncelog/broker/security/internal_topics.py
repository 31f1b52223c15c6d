"""What clients may not do to the topics the broker owns (`core.topic_names`), whatever their ACLs.

`__transaction_state` is the transaction coordinator's log: a record a client slipped into it
would be loaded as a coordinator's decision (a forged PrepareCommit completes another producer's
transaction). So, as in Kafka, a client may not append to an internal topic (Produce:
INVALID_TOPIC_EXCEPTION, Kafka's ReplicaManager.appendToLocalLog), delete its records
(DeleteRecords: INVALID_TOPIC_EXCEPTION) or add it to a transaction (AddPartitionsToTxn:
TOPIC_AUTHORIZATION_FAILED). Beyond Kafka, which leaves these to ACLs, a client may not create an
internal topic (INVALID_REQUEST, as Kafka refuses `__cluster_metadata`), delete one or add
partitions to one (INVALID_TOPIC_EXCEPTION: the coordinator maps ids to partitions by their count),
or set its `cleanup.policy` to anything but `compact` (INVALID_CONFIG: the coordinator keeps each
id's latest record, retention would drop live transactions). Its other configs alter as any
topic's. Reading one (READ) is allowed, as in Kafka.

Each refusal is logged with the principal and address that asked.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping

from oncelog.broker.net.request_context import CLIENT, PRINCIPAL
from oncelog.core.topic_names import BROKER_OWNED_TOPICS, is_internal
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

log = logging.getLogger("oncelog.broker")

COMPACT = "compact"


def refusal(action: str, topic: str) -> str:
    """Log that the caller may not `action` internal `topic`; the message for its answer."""
    message = f"Cannot {action} internal topic {topic}"
    log.warning("%s: refused to %s from %s", message, PRINCIPAL.get(), CLIENT.get()[1] or "?")
    return message


def refuse(action: str, topic: str) -> None:
    """INVALID_TOPIC_EXCEPTION if `topic` is internal."""
    if is_internal(topic):
        raise KafkaProtocolError(ErrorCode.INVALID_TOPIC_EXCEPTION, refusal(action, topic))


def refuse_creation(topic: str) -> None:
    """INVALID_REQUEST for a name only the broker creates (Kafka's answer for `__cluster_metadata`)."""
    if topic in BROKER_OWNED_TOPICS:
        raise KafkaProtocolError(ErrorCode.INVALID_REQUEST, refusal("create", topic))


def check_overrides(topic: str, overrides: Mapping[str, str | None]) -> None:
    """An internal topic's config overrides after a change keep `cleanup.policy=compact`."""
    policy = overrides.get("cleanup.policy")
    if is_internal(topic) and policy != COMPACT:
        # (the value is the client's: quoted if odd, it cannot fake a log line)
        shown = "(unset)" if policy is None else policy if policy.isidentifier() else repr(policy)
        raise KafkaProtocolError(ErrorCode.INVALID_CONFIG, refusal(f"set cleanup.policy={shown} on", topic))
