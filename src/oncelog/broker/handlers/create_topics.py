"""CreateTopics (API 19), v2-v7. One replica per partition: a replication factor other than 1
(or -1, the default) is refused; the name (`core.topic_names`: INVALID_TOPIC_EXCEPTION) and the
configs are validated before anything is created, validate_only or not. The broker's own topics
are not created by clients (INVALID_REQUEST, `broker.security.internal_topics`). Needs CREATE on the
cluster or on the topic (TOPIC_AUTHORIZATION_FAILED); the configs in the answer (v5+, KIP-525)
need DESCRIBE_CONFIGS on the topic."""
from __future__ import annotations

from typing import Any

from oncelog.broker.handlers.describe_configs import topic_config_entries
from oncelog.broker.security import internal_topics
from oncelog.broker.security.authorization import TOPIC, Op, authorize, authorize_cluster
from oncelog.broker.services import BrokerServices
from oncelog.core.topic_config import parse_topic_configs
from oncelog.core.topic_names import validate_topic_name
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.CREATE_TOPICS


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    results = []
    on_cluster = authorize_cluster(broker, Op.CREATE, audit=False)
    for t in request.topics:
        name = str(t.name)
        try:
            internal_topics.refuse_creation(name)
            if not (on_cluster or authorize(broker, Op.CREATE, TOPIC, name)):
                raise KafkaProtocolError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")
            validate_topic_name(name)
            partitions = _partitions(broker, t)
            overrides = {c.name: c.value for c in t.configs if c.value is not None}
            parse_topic_configs(overrides)
            if request.validate_only:
                if name in broker.logs.topics:
                    raise KafkaProtocolError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} exists")
                topic_id = None
            else:
                topic_id = (await broker.logs.create_topic(name, partitions, overrides, broker.now_ms())).topic_id
        except KafkaProtocolError as e:
            results.append(rb("CreatableTopicResult", name=t.name, topic_id=None, error_code=e.code,
                              error_message=e.message, num_partitions=-1, replication_factor=-1,
                              configs=None))
            continue
        configs = None
        if version >= 5 and topic_id is not None and authorize(broker, Op.DESCRIBE_CONFIGS, TOPIC, name,
                                                               audit=False):
            configs = tuple(rb("CreatableTopicConfigs", name=n, value=v, read_only=False,
                               config_source=src, is_sensitive=False)
                            for n, v, src, *_ in topic_config_entries(broker, name))
        results.append(rb("CreatableTopicResult", name=t.name, topic_id=topic_id, error_code=ErrorCode.NONE,
                          error_message=None, num_partitions=partitions, replication_factor=1,
                          configs=configs))
    return rb.encode(throttle_time=0, topics=tuple(results))


def _partitions(broker: BrokerServices, t: Any) -> int:
    if int(t.replication_factor) not in (-1, 1):
        raise KafkaProtocolError(ErrorCode.INVALID_REPLICATION_FACTOR,
                                 "oncelog keeps one replica per partition: use replication factor 1")
    if t.assignments:
        return len(t.assignments)
    n = int(t.num_partitions)
    if n == -1:
        return int(broker.config["num.partitions"])
    if n < 1:
        raise KafkaProtocolError(ErrorCode.INVALID_PARTITIONS, f"{n} partitions")
    return n


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode_error(code, topics=tuple(rb.error("CreatableTopicResult", code, name=t.name, configs=None)
                                              for t in request.topics))
