"""Consumer groups as the admin client sees them (kafka-consumer-groups' requests): ListGroups of
every broker (each lists the groups it coordinates, v5 with each group's type), at the group's
coordinator ConsumerGroupDescribe for a KIP-848 group (its epochs, each member's epoch and target
assignment) and DescribeGroups for a classic one (what librdkafka's AdminClient does: the first
answers GROUP_ID_NOT_FOUND for a classic group), OffsetFetch, offsets set by an OffsetCommit
outside any generation (Kafka's `Admin.alterConsumerGroupOffsets`: the coordinator takes it only
while the group has no members), DeleteGroups, OffsetDelete (`Admin.deleteConsumerGroupOffsets`)."""
from __future__ import annotations

import asyncio
import time
from typing import NamedTuple

from oncelog.client.aio import wire
from oncelog.client.aio.admin_base import AdminError, ask
from oncelog.client.aio.cluster import Cluster
from oncelog.client.aio.connection import Connection
from oncelog.client.types import TopicPartition
from oncelog.protocol.api import ApiKey
from oncelog.protocol.consumer_protocol import decode_assignment
from oncelog.protocol.entities import RequestBuilder
from oncelog.protocol.errors import ErrorCode

GROUP_KEY, TRANSACTION_KEY = 0, 1
RETRY_COORDINATOR = _RETRY_COORDINATOR = {ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                      ErrorCode.NOT_COORDINATOR}


class GroupListing(NamedTuple):
    group: str
    protocol_type: str   # "consumer" for consumer groups, "" for groups that only commit offsets
    state: str
    type: str = "classic"   # "consumer" for a KIP-848 group (brokers serving ListGroups v5 say)


class GroupMember(NamedTuple):
    member_id: str
    instance_id: str | None
    client_id: str
    host: str
    assignment: tuple[TopicPartition, ...]
    member_epoch: int = -1                        # KIP-848 groups
    target: tuple[TopicPartition, ...] = ()       # KIP-848: what the coordinator is moving it to


class GroupDescription(NamedTuple):
    group: str
    state: str           # Kafka's names: Empty, Stable, PreparingRebalance, CompletingRebalance, Dead;
    protocol_type: str   # a KIP-848 group's: Empty, Assigning, Reconciling, Stable
    protocol: str        # the assignor of a Stable consumer group ("range", "uniform" ...), else ""
    members: tuple[GroupMember, ...]
    type: str = "classic"
    group_epoch: int = -1       # KIP-848 groups
    assignment_epoch: int = -1


async def coordinator(cluster: Cluster, key: str, key_type: int = GROUP_KEY) -> Connection:
    """A connection to the coordinator of a group (or of a transactional id), waiting out a
    coordinator that is still loading."""
    return await cluster.connection(await find_coordinator(cluster, key, key_type))


async def find_coordinator(cluster: Cluster, key: str, key_type: int = GROUP_KEY) -> int:
    """The node id of the coordinator of a group (or of a transactional id), waiting out a
    coordinator that is still loading; the cluster knows the broker's address when it returns."""
    deadline = time.monotonic() + cluster.timeout_s
    delay = 0.05
    while True:
        v, body = await cluster.request_any(ApiKey.FIND_COORDINATOR, lambda v: _find_coordinator(v, key, key_type))
        r = wire.decode(ApiKey.FIND_COORDINATOR, v, body)
        c = r.coordinators[0] if v >= 4 else r
        code = int(c.error_code)
        if code == ErrorCode.NONE:
            if c.node_id not in cluster.brokers:
                await cluster.refresh([])
            return int(c.node_id)
        if code not in _RETRY_COORDINATOR or time.monotonic() > deadline:
            raise AdminError(code, f"find the coordinator of {key}", c.error_message)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


def _find_coordinator(v: int, key: str, key_type: int) -> bytes:
    rq = RequestBuilder(ApiKey.FIND_COORDINATOR, v)
    if v >= 4:
        return rq.encode(key_type=key_type, coordinator_keys=(key,))
    return rq.encode(key=key, key_type=key_type)


class GroupAdmin:
    """The admin client's group methods (mixed into AIOAdminClient, which owns `cluster`)."""

    cluster: Cluster

    async def list_groups(self) -> list[GroupListing]:
        if not self.cluster.brokers:
            await self.cluster.refresh([])
        out = []
        for node in sorted(self.cluster.brokers):
            conn = await self.cluster.connection(node)
            _, r = await ask(conn, ApiKey.LIST_GROUPS, lambda rq: rq.encode(states_filter=(), types_filter=()),
                              self.cluster.timeout_s)
            if r.error_code:
                raise AdminError(r.error_code, f"list the groups of broker {node}")
            out += [GroupListing(str(g.group_id), g.protocol_type, getattr(g, "group_state", ""),
                                 getattr(g, "group_type", "") or "classic")
                    for g in r.groups]
        return sorted(out)

    async def describe_group(self, group: str) -> GroupDescription:
        conn = await coordinator(self.cluster, group)
        if conn.version(ApiKey.CONSUMER_GROUP_DESCRIBE) is not None:
            _, c = await ask(conn, ApiKey.CONSUMER_GROUP_DESCRIBE, lambda rq: rq.encode(
                group_ids=(group,), include_authorized_operations=False), self.cluster.timeout_s)
            d = c.groups[0]
            if d.error_code.value == ErrorCode.NONE:
                def tps(a) -> tuple[TopicPartition, ...]:
                    return tuple(sorted(TopicPartition(str(t.topic_name), int(p))
                                        for t in a.topic_partitions for p in t.partitions))
                return GroupDescription(group, d.group_state, "consumer", d.assignor_name, tuple(
                    GroupMember(m.member_id, m.instance_id, m.client_id, m.client_host, tps(m.assignment),
                                int(m.member_epoch), tps(m.target_assignment)) for m in d.members),
                    "consumer", int(d.group_epoch), int(d.assignment_epoch))
            if d.error_code.value not in (ErrorCode.GROUP_ID_NOT_FOUND, ErrorCode.UNSUPPORTED_VERSION):
                raise AdminError(d.error_code.value, f"describe group {group}", d.error_message)
        if conn.version(ApiKey.SHARE_GROUP_DESCRIBE) is not None:   # a share group (KIP-932)?
            _, sh = await ask(conn, ApiKey.SHARE_GROUP_DESCRIBE, lambda rq: rq.encode(
                group_ids=(group,), include_authorized_operations=False), self.cluster.timeout_s)
            d = sh.groups[0]
            if d.error_code.value == ErrorCode.NONE:
                def shared(a) -> tuple[TopicPartition, ...]:
                    return tuple(sorted(TopicPartition(str(t.topic_name), int(p))
                                        for t in a.topic_partitions for p in t.partitions))
                return GroupDescription(group, d.group_state, "share", d.assignor_name, tuple(
                    GroupMember(m.member_id, None, m.client_id, m.client_host, shared(m.assignment),
                                int(m.member_epoch)) for m in d.members),
                    "share", int(d.group_epoch), int(d.assignment_epoch))
            if d.error_code.value not in (ErrorCode.GROUP_ID_NOT_FOUND, ErrorCode.UNSUPPORTED_VERSION):
                raise AdminError(d.error_code.value, f"describe group {group}", d.error_message)
        _, r = await ask(conn, ApiKey.DESCRIBE_GROUPS, lambda rq: rq.encode(
            groups=(group,), include_authorized_operations=False), self.cluster.timeout_s)
        g = r.groups[0]
        if g.error_code:
            raise AdminError(g.error_code, f"describe group {group}")
        consumer = g.protocol_type == "consumer"
        members = tuple(GroupMember(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                    tuple(TopicPartition(t, p) for t, p in decode_assignment(m.member_assignment))
                                    if consumer else ())
                        for m in g.members)
        return GroupDescription(group, g.group_state, g.protocol_type, g.protocol_data, members)

    async def list_group_offsets(self, group: str) -> dict[TopicPartition, int]:
        """The group's committed offsets (partitions without one are left out)."""
        conn = await coordinator(self.cluster, group)
        _, r = await ask(conn, ApiKey.OFFSET_FETCH, lambda rq: rq.encode(
            group_id=group, topics=None, require_stable=True), self.cluster.timeout_s)
        if r.error_code:
            raise AdminError(r.error_code, f"fetch the offsets of group {group}")
        out = {}
        for t in r.topics:
            for p in t.partitions:
                if p.error_code:
                    raise AdminError(p.error_code, f"fetch the offset of {group} on {t.name}-{p.partition_index}")
                if p.committed_offset >= 0:
                    out[TopicPartition(str(t.name), int(p.partition_index))] = int(p.committed_offset)
        return out

    async def alter_group_offsets(self, group: str, offsets: dict[TopicPartition, int]) -> None:
        """Commit `offsets` for a group without members (else UNKNOWN_MEMBER_ID, as Kafka)."""
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for tp, off in sorted(offsets.items()):
            by_topic.setdefault(tp.topic, []).append((tp.partition, off))
        conn = await coordinator(self.cluster, group)
        _, r = await ask(conn, ApiKey.OFFSET_COMMIT, lambda rq: rq.encode(
            group_id=group, generation_id=-1, generation_id_or_member_epoch=-1, member_id="",
            group_instance_id=None, retention_time_ms=-1, topics=tuple(
                rq("OffsetCommitRequestTopic", name=t, partitions=tuple(
                    rq("OffsetCommitRequestPartition", partition_index=p, committed_offset=o,
                       committed_leader_epoch=-1, committed_metadata="", commit_timestamp=-1)
                    for p, o in ps))
                for t, ps in by_topic.items())), self.cluster.timeout_s)
        for t in r.topics:
            for p in t.partitions:
                if p.error_code:
                    raise AdminError(p.error_code, f"commit the offset of {group} on {t.name}-{p.partition_index}")

    async def delete_group_offsets(self, group: str, tps: list[TopicPartition]) -> None:
        """OffsetDelete: forget the group's committed offsets of `tps` (refused for a partition
        the group consumes: GROUP_SUBSCRIBED_TO_TOPIC, as Kafka)."""
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(tps):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        conn = await coordinator(self.cluster, group)
        _, r = await ask(conn, ApiKey.OFFSET_DELETE, lambda rq: rq.encode(
            group_id=group, topics=tuple(
                rq("OffsetDeleteRequestTopic", name=t, partitions=tuple(
                    rq("OffsetDeleteRequestPartition", partition_index=p) for p in ps))
                for t, ps in by_topic.items())), self.cluster.timeout_s)
        if r.error_code:
            raise AdminError(r.error_code, f"delete the offsets of group {group}")
        for t in r.topics:
            for p in t.partitions:
                if p.error_code:
                    raise AdminError(p.error_code, f"delete the offset of {group} on {t.name}-{p.partition_index}")

    async def delete_groups(self, groups: list[str]) -> None:
        for group in groups:
            conn = await coordinator(self.cluster, group)
            _, r = await ask(conn, ApiKey.DELETE_GROUPS, lambda rq, g=group: rq.encode(groups_names=(g,)),
                              self.cluster.timeout_s)
            for result in r.results:
                if result.error_code:
                    raise AdminError(result.error_code, f"delete group {result.group_id}")
