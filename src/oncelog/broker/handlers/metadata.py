"""Metadata (API 3), v1-v12: brokers, topics with ids (v10+), partition leaders; auto-creation
when `auto.create.topics.enable` and the client allows it."""
from __future__ import annotations

import logging

from oncelog.protocol import entities
from oncelog.protocol import metadata as wire
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.storage.partition import message_format_magic

API_KEY = ApiKey.METADATA
log = logging.getLogger(__name__)


def handle(broker, version: int, body) -> bytes:
    request = entities.decode_request(API_KEY, version, body)
    if request.topics is None:
        wanted = sorted(broker.logs.topics)
    else:
        wanted = []
        for t in request.topics:
            name = t.name if getattr(t, "name", None) is not None else broker.logs.topic_name(
                getattr(t, "topic_id", None))
            wanted.append(name if name is not None else getattr(t, "topic_id", None))
    allow_create = getattr(request, "allow_auto_topic_creation", True)
    topics = [topic_entry(broker, name, allow_create) for name in wanted]
    brokers = [wire.BrokerEntry(broker.node_id, broker.advertised_host, broker.advertised_port)]
    return wire.encode_response(version, brokers, broker.cluster_id, broker.node_id, topics)


def topic_entry(broker, name, allow_create: bool) -> wire.TopicEntry:
    if not isinstance(name, str):  # a topic id we do not know
        return wire.TopicEntry(None, ErrorCode.UNKNOWN_TOPIC_ID, topic_id=name)
    info = broker.logs.topics.get(name)
    if info is None and allow_create and broker.config["auto.create.topics.enable"]:
        try:
            info = broker.logs.create_topic(name, broker.config["num.partitions"], {}, broker.now_ms())
            log.info("auto-created topic %s with %d partitions", name, info.partitions)
        except KafkaProtocolError as e:
            return wire.TopicEntry(name, e.code)
    if info is None:
        return wire.TopicEntry(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    partitions = tuple(wire.PartitionEntry(i, 0, broker.node_id, 0) for i in range(info.partitions))
    magic = message_format_magic(broker.logs.topic_config(name)["message.format.version"])
    return wire.TopicEntry(name, 0, info.topic_id, partitions, magic)
