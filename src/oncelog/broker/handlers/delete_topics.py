"""DeleteTopics (API 20), v1-v6 (v6 names topics by name or id). Committed group offsets of a
deleted topic are deleted with it. Needs DELETE on the topic (TOPIC_AUTHORIZATION_FAILED); a topic
named by its id is answered without its name unless the caller may DESCRIBE it, as Kafka answers.
An internal topic is never deleted (INVALID_TOPIC_EXCEPTION, `broker.security.internal_topics`)."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security import internal_topics
from oncelog.broker.security.authorization import TOPIC, Op, authorize
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.DELETE_TOPICS


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    if version >= 6:
        wanted = [(t.name, t.topic_id) for t in request.topics]
    else:
        wanted = [(name, None) for name in request.topic_names]
    results = []
    for name, topic_id in wanted:
        by_id = name is None and topic_id is not None
        if by_id:
            name = broker.logs.topic_name(topic_id)
        code: int
        code, message = ErrorCode.NONE, None
        if name is None:
            code = ErrorCode.UNKNOWN_TOPIC_ID
        elif by_id and not authorize(broker, Op.DESCRIBE, TOPIC, str(name)):
            code, name = ErrorCode.TOPIC_AUTHORIZATION_FAILED, None   # the id must not tell the name
        elif not authorize(broker, Op.DELETE, TOPIC, str(name)):
            code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        else:
            info = broker.logs.topics.get(str(name))
            topic_id = info.topic_id if info is not None else topic_id
            try:
                internal_topics.refuse("delete", str(name))
                await broker.logs.delete_topic(str(name))
                # as Kafka does: a topic created again under this name starts without old commits
                broker.groups.delete_topic(str(name))
            except KafkaProtocolError as e:
                code, message = e.code, e.message
        results.append(rb("DeletableTopicResult", name=name, topic_id=topic_id, error_code=code,
                          error_message=message))
    return rb.encode(throttle_time=0, responses=tuple(results))


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    named = [(t.name, t.topic_id) for t in request.topics] if version >= 6 else \
        [(name, None) for name in request.topic_names]
    return rb.encode_error(code, responses=tuple(rb.error("DeletableTopicResult", code, name=name, topic_id=tid)
                                                 for name, tid in named))
