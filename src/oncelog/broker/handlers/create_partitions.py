"""CreatePartitions (API 37), v0-v3 (KIP-195): grow a topic's partition count. The new partitions
get leaders as CreateTopics' do (a single node leads them all; in a cluster the controller places
them, or takes the one broker each assignment names), and Metadata shows them at once, so clients
pick them up at their next refresh. Kafka's errors: INVALID_PARTITIONS when the count does not
increase, UNKNOWN_TOPIC_OR_PARTITION, INVALID_REPLICA_ASSIGNMENT for an assignment that does not
name exactly one known broker per new partition, INVALID_REQUEST for a topic named twice. Needs
ALTER on the topic (TOPIC_AUTHORIZATION_FAILED). An internal topic keeps its count
(INVALID_TOPIC_EXCEPTION: its coordinator maps keys to partitions by it; `broker.security.internal_topics`)."""
from __future__ import annotations

from collections import Counter
from typing import Any

from oncelog.broker.security import internal_topics
from oncelog.broker.security.authorization import TOPIC, Op, authorize
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.CREATE_PARTITIONS


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    named = Counter(str(t.name) for t in request.topics)
    results = []
    for t in request.topics:
        name = str(t.name)
        code: int = ErrorCode.NONE
        message: str | None = None
        try:
            if named[name] > 1:
                raise KafkaProtocolError(ErrorCode.INVALID_REQUEST, "Duplicate topic name.")
            if not authorize(broker, Op.ALTER, TOPIC, name):
                raise KafkaProtocolError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")
            internal_topics.refuse("add partitions to", name)
            assignments = None if t.assignments is None else [[int(b) for b in a.broker_ids] for a in t.assignments]
            await broker.logs.create_partitions(name, int(t.count), assignments, broker.now_ms(),
                                                validate_only=bool(request.validate_only))
        except KafkaProtocolError as e:
            code, message = e.code, e.message
        results.append(rb("CreatePartitionsTopicResult", name=t.name, error_code=code, error_message=message))
    return rb.encode(throttle_time=0, results=tuple(results))


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode_error(code, results=tuple(rb.error("CreatePartitionsTopicResult", code, name=t.name)
                                               for t in request.topics))
