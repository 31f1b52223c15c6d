"""Topic names, as Kafka's `org.apache.kafka.common.internals.Topic` has them: which names are legal,
and which topics belong to the broker rather than to clients.

`validate_topic_name` is the one check every path takes before a name goes into the controller's
metadata log, a broker's registry or a directory name (CreateTopics, Metadata auto-creation, the
controller's decision, storage): 1 to 249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`, else
INVALID_TOPIC_EXCEPTION with Kafka's text. Anything else could name a directory outside the data
directory (`../x`) or one the broker cannot tell from its own files.

Internal topics (Kafka's `Topic.isInternal`) hold the coordinators' state: no client appends to
them, whatever the ACLs say (Kafka's ReplicaManager.appendToLocalLog).
"""
from __future__ import annotations

import re

from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

MAX_NAME_LENGTH = 249
_LEGAL = re.compile(r"[a-zA-Z0-9._-]*")

CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"
SHARE_GROUP_STATE_TOPIC = "__share_group_state"
CLUSTER_METADATA_TOPIC = "__cluster_metadata"
INTERNAL_TOPICS = frozenset({CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, SHARE_GROUP_STATE_TOPIC})
# what only the broker creates: the internal topics, and the name of the controller's own log
# (Kafka's ControllerApis refuses to create that one with INVALID_REQUEST)
BROKER_OWNED_TOPICS = INTERNAL_TOPICS | {CLUSTER_METADATA_TOPIC}


def invalid_topic_reason(name: str | None) -> str | None:
    """Why `name` cannot name a topic (Kafka's wording), or None when it can."""
    if name is None:
        return "a null name is not allowed"
    if not name:
        return "the empty string is not allowed"
    if name in (".", ".."):
        return f"'{name}' is not allowed"
    if len(name) > MAX_NAME_LENGTH:
        return f"the length of '{name}' is longer than the max allowed length {MAX_NAME_LENGTH}"
    if not _LEGAL.fullmatch(name):
        return f"'{name}' contains one or more characters other than ASCII alphanumerics, '.', '_' and '-'"
    return None


def validate_topic_name(name: str | None) -> str:
    """`name`, or INVALID_TOPIC_EXCEPTION (Kafka's `Topic.validate`)."""
    reason = invalid_topic_reason(name)
    if reason is not None:
        raise KafkaProtocolError(ErrorCode.INVALID_TOPIC_EXCEPTION, f"Topic name is invalid: {reason}")
    assert name is not None  # a None name has a reason
    return name


def is_internal(name: str | None) -> bool:
    return name in INTERNAL_TOPICS
