"""Metadata (API 3), v0-v12: brokers, topics with ids (v10+), partition leaders and leader epochs;
auto-creation when `auto.create.topics.enable` and the client allows it. In a cluster the brokers
and leaders come from the controller's view, so a client learns where a partition moved.

Authorization (Kafka's KafkaApis.handleTopicMetadataRequest): a topic needs DESCRIBE. Asked for
all topics, those the caller may not describe are left out; named, they are answered
TOPIC_AUTHORIZATION_FAILED without looking whether they exist, and one asked for by its id (v12)
without its name. Auto-creation needs CREATE on the cluster or on the topic (else
TOPIC_AUTHORIZATION_FAILED) and a legal name (else INVALID_TOPIC_EXCEPTION); it never creates the
broker's own topics (`core.topic_names.BROKER_OWNED_TOPICS`), which their coordinators create.
Internal topics are marked `is_internal`."""
from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any

from oncelog.broker.security.authorization import (
    CLUSTER,
    OMITTED,
    TOPIC,
    Op,
    authorize,
    authorize_cluster,
    authorized_names,
    authorized_operations,
)
from oncelog.broker.services import BrokerServices
from oncelog.core.topic_names import BROKER_OWNED_TOPICS, invalid_topic_reason, is_internal
from oncelog.protocol import metadata as wire
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.primitives import NULL_UUID
from oncelog.protocol.records import message_format_magic

API_KEY = ApiKey.METADATA
log = logging.getLogger(__name__)


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    if version == 0 and not request.topics:
        request = dataclasses.replace(request, topics=None)  # v0's empty array asks for all (v1+: null)
    by_id: dict[str, uuid.UUID] = {}   # names the request gave only as topic ids
    if request.topics is None:
        wanted: list[str] = sorted(authorized_names(broker, Op.DESCRIBE, TOPIC, broker.logs.topics, audit=False))
    else:
        wanted = []
        for t in request.topics:
            name = getattr(t, "name", None)
            if name is None:
                name = broker.logs.topic_name(t.topic_id)
                if name is None:
                    wanted.append(t.topic_id)
                    continue
                by_id[name] = t.topic_id
            wanted.append(name)
    allow_create = getattr(request, "allow_auto_topic_creation", True)
    described: set[str] = set()
    if request.topics is not None:
        described = authorized_names(broker, Op.DESCRIBE, TOPIC, (n for n in wanted if isinstance(n, str)))
    topics = [_denied(name, by_id)
              if request.topics is not None and isinstance(name, str) and name not in described
              else await topic_entry(broker, name, allow_create) for name in wanted]
    me = wire.BrokerEntry(broker.node_id, broker.advertised_host, broker.advertised_port)
    brokers = [wire.BrokerEntry(b.node_id, b.host, b.port) for b in broker.logs.brokers]
    if all(b.node_id != broker.node_id for b in brokers):
        brokers.append(me)  # a single node; or the controller has not seen our heartbeat yet, clients have
    # As Kafka's metadata cache does: a leader the controller does not know as alive (it
    # died, or the controller restarted and has not heard from it) is not offered to clients,
    # who would otherwise look for a broker id missing from the list.
    alive = {b.node_id for b in brokers}
    topics = [_without_dead_leaders(t, alive) for t in topics]
    # KIP-430, asked for by v8+
    if getattr(request, "include_topic_authorized_operations", False):
        for t in topics:
            if t.error_code == ErrorCode.NONE:
                t.authorized_operations = authorized_operations(broker, TOPIC, t.name or "")
    cluster_operations = OMITTED
    if getattr(request, "include_cluster_authorized_operations", False):
        cluster_operations = (authorized_operations(broker, CLUSTER, "kafka-cluster")
                              if authorize_cluster(broker, Op.DESCRIBE, audit=False) else 0)
    return wire.encode_response(version, brokers, broker.cluster_id, broker.node_id, topics, cluster_operations)


def _denied(name: str, by_id: dict[str, uuid.UUID]) -> wire.TopicEntry:
    """TOPIC_AUTHORIZATION_FAILED; asked for by id, the id is told back but never the name."""
    if name in by_id:
        return wire.TopicEntry(None, ErrorCode.TOPIC_AUTHORIZATION_FAILED, topic_id=by_id[name])
    return wire.TopicEntry(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED)


def _without_dead_leaders(topic: wire.TopicEntry, alive: set[int]) -> wire.TopicEntry:
    if not topic.partitions or all(p.leader_id in alive or p.leader_id < 0 for p in topic.partitions):
        return topic
    topic.partitions = tuple(p if p.leader_id in alive or p.leader_id < 0 else
                             wire.PartitionEntry(p.index, ErrorCode.LEADER_NOT_AVAILABLE, -1,
                                                 p.leader_epoch) for p in topic.partitions)
    return topic


async def topic_entry(broker: BrokerServices, name: Any, allow_create: bool) -> wire.TopicEntry:
    if not isinstance(name, str):  # a topic id we do not know
        return wire.TopicEntry(None, ErrorCode.UNKNOWN_TOPIC_ID, topic_id=name)
    info = broker.logs.topics.get(name)
    if (info is None and allow_create and broker.config["auto.create.topics.enable"]
            and name not in BROKER_OWNED_TOPICS):
        if not (authorize_cluster(broker, Op.CREATE, audit=False) or authorize(broker, Op.CREATE, TOPIC, name)):
            return wire.TopicEntry(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
        try:
            info = await broker.logs.create_topic(name, broker.config["num.partitions"], {}, broker.now_ms())
            log.info("auto-created topic %s with %d partitions", name, info.partitions)
        except KafkaProtocolError as e:
            if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                return wire.TopicEntry(name, e.code)
            info = broker.logs.topics.get(name)
    if info is None:
        return wire.TopicEntry(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if invalid_topic_reason(name) is None
                               else ErrorCode.INVALID_TOPIC_EXCEPTION)
    partitions = []
    for i in range(info.partitions):
        leader, epoch = broker.logs.leader(name, i)
        partitions.append(wire.PartitionEntry(i, 0 if leader >= 0 else ErrorCode.LEADER_NOT_AVAILABLE, leader, epoch))
    magic = message_format_magic(broker.logs.topic_config(name)["message.format.version"])
    return wire.TopicEntry(name, 0, info.topic_id, tuple(partitions), magic, is_internal=is_internal(name))


def error_response(version: int, request: Any, code: int) -> bytes:
    """`code` for each topic named (none when all were asked for), and no brokers."""
    topics = [wire.TopicEntry(t.name, code, topic_id=getattr(t, "topic_id", None) or NULL_UUID)
              for t in request.topics or ()]
    return wire.encode_response(version, [], None, -1, topics)
