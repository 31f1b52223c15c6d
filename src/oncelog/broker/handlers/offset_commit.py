"""OffsetCommit (API 8), v2-v9: durable before it is acknowledged (the records of the partitions it
names appended to the group's offset log, answered after the group commit's fsync, off the event
loop: `broker.groups.offsets`). Generation -1 with no member
id is a standalone commit (a consumer using assign), accepted while the group has no members.
v2-v4 may ask for their own retention time; v7+ names the static instance; v9 carries a consumer
group member's epoch (KIP-848: STALE_MEMBER_EPOCH for another epoch, and such a member must use
v9) and answers GROUP_ID_NOT_FOUND for a member of an unknown group. A partition the
topic does not have gets UNKNOWN_TOPIC_OR_PARTITION, one whose metadata is longer than
`offset.metadata.max.bytes` OFFSET_METADATA_TOO_LARGE (Kafka's bound on what a commit keeps). Needs
READ on the group (else GROUP_AUTHORIZATION_FAILED for every partition) and READ on each topic
(TOPIC_AUTHORIZATION_FAILED)."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import GROUP, TOPIC, Op, authorized_names, require
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities, offset_commit_answers
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode
from oncelog.storage.group_offsets import Committed

API_KEY = ApiKey.OFFSET_COMMIT


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    require(broker, Op.READ, GROUP, str(r.group_id))
    readable = authorized_names(broker, Op.READ, TOPIC, (str(t.name) for t in r.topics))
    offsets, unknown, denied, too_large = {}, set(), set(), set()
    max_metadata = broker.config["offset.metadata.max.bytes"]
    for t in r.topics:
        for p in t.partitions:
            if str(t.name) not in readable:
                denied.add((str(t.name), int(p.partition_index)))
                continue
            if not _exists(broker, str(t.name), int(p.partition_index)):
                unknown.add((str(t.name), int(p.partition_index)))
                continue
            if p.committed_metadata is not None and len(p.committed_metadata) > max_metadata:
                too_large.add((str(t.name), int(p.partition_index)))
                continue
            offsets[(str(t.name), int(p.partition_index))] = Committed(
                int(p.committed_offset), p.committed_metadata,
                int(getattr(p, "committed_leader_epoch", -1)))
    generation = int(getattr(r, "generation_id_or_member_epoch", getattr(r, "generation_id", -1)))
    error: int
    if not broker.coordinates(str(r.group_id)):
        error = ErrorCode.NOT_COORDINATOR
    elif offsets:
        error = await broker.groups.commit_durably(
            str(r.group_id), generation, r.member_id, offsets, getattr(r, "group_instance_id", None),
            entities.millis(getattr(r, "retention_time", None)), api_version=version)
    else:
        error = ErrorCode.NONE
    # written by hand, its errors counted here: a commit may name thousands of partitions
    # (`protocol.offset_commit_answers`)
    topics = [(str(t.name), [(int(p.partition_index), offset_commit_answers.partition_code(
        (str(t.name), int(p.partition_index)), error, denied, unknown, too_large)) for p in t.partitions])
        for t in r.topics]
    broker.metrics.count_errors("OffsetCommit", (code for _t, ps in topics for _i, code in ps))
    return offset_commit_answers.offset_commit(version, topics)


def _exists(broker: BrokerServices, topic: str, index: int) -> bool:
    # the topic's metadata, not local leadership: in a cluster the group's coordinator commits
    # offsets of partitions other brokers lead
    info = broker.logs.topics.get(topic)
    return info is not None and 0 <= index < info.partitions


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode_error(code, topics=tuple(
        rb.error("OffsetCommitResponseTopic", code, name=t.name, partitions=tuple(
            rb.error("OffsetCommitResponsePartition", code, partition_index=p.partition_index)
            for p in t.partitions))
        for t in request.topics))
