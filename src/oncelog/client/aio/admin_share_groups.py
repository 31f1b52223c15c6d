"""Share groups' offsets as the admin client sees them (Kafka's Admin.listShareGroupOffsets,
alterShareGroupOffsets and deleteShareGroupOffsets; kafka-share-groups.sh's requests), each at the
group's coordinator: DescribeShareGroupOffsets (each share-partition's start offset, and its lag
where the broker serves v1), AlterShareGroupOffsets (a group without members), and
DeleteShareGroupOffsets (whole topics' state, a group without members). A coordinator that moved
or is loading is found again until the request timeout."""
from __future__ import annotations

import asyncio
import time
from typing import Any, NamedTuple

from oncelog.client.aio.admin_base import AdminError, ask
from oncelog.client.aio.admin_groups import RETRY_COORDINATOR, coordinator
from oncelog.client.aio.cluster import Cluster
from oncelog.client.types import TopicPartition
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, UnknownErrorCode, error_code


class SharePartitionOffset(NamedTuple):
    """Kafka's SharePartitionOffsetInfo: the share-partition start offset (None: the group has no
    state there), the leader epoch, and the lag (None where unknown: a broker serving v0, or no
    state)."""
    start_offset: int | None
    leader_epoch: int | None
    lag: int | None


class ShareGroupAdmin:
    """The admin client's share-group offset methods (mixed into AIOAdminClient)."""

    cluster: Cluster

    async def _at_coordinator(self, group: str, api_key: int, build, error_of) -> Any:
        """`build(RequestBuilder)` at the group's coordinator, asked again (a new coordinator
        looked up) while the answer's `error_of(answer)` is NOT_COORDINATOR or the coordinator is
        loading, until the request timeout."""
        deadline = time.monotonic() + self.cluster.timeout_s
        delay = 0.05
        while True:
            conn = await coordinator(self.cluster, group)
            _v, r = await ask(conn, api_key, build, self.cluster.timeout_s)
            if int(error_of(r)) not in RETRY_COORDINATOR or time.monotonic() > deadline:
                return r
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def list_share_group_offsets(self, group: str, partitions: list[TopicPartition] | None = None
                                       ) -> dict[TopicPartition, SharePartitionOffset]:
        """Each share-partition of `partitions` (None: every one the group has a state for) with
        its start offset and lag."""
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(partitions or ()):
            by_topic.setdefault(tp.topic, []).append(tp.partition)

        def build(rq):
            topics = None if partitions is None else tuple(
                rq("DescribeShareGroupOffsetsRequestTopic", topic_name=t, partitions=tuple(ps))
                for t, ps in by_topic.items())
            return rq.encode(groups=(rq("DescribeShareGroupOffsetsRequestGroup", group_id=group, topics=topics),))

        r = await self._at_coordinator(group, ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, build,
                                       lambda r: r.groups[0].error_code if r.groups else 0)
        g = r.groups[0]
        if int(g.error_code):
            raise AdminError(g.error_code, f"list the share offsets of group {group}", g.error_message)
        out = {}
        for t in g.topics:
            for p in t.partitions:
                tp = TopicPartition(str(t.topic_name), int(p.partition_index))
                if int(p.error_code):
                    raise AdminError(p.error_code, f"list the share offset of {group} on {tp.topic}-{tp.partition}",
                                     p.error_message)
                start = int(p.start_offset)
                lag = int(getattr(p, "lag", -1))
                out[tp] = SharePartitionOffset(start if start >= 0 else None,
                                               int(p.leader_epoch) if start >= 0 else None,
                                               lag if lag >= 0 else None)
        return out

    async def alter_share_group_offsets(self, group: str, offsets: dict[TopicPartition, int]) -> None:
        """Set the start offsets of a share group without members (NON_EMPTY_GROUP otherwise);
        AdminError with the first partition's refusal."""
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for tp, off in sorted(offsets.items()):
            by_topic.setdefault(tp.topic, []).append((tp.partition, int(off)))

        def build(rq):
            return rq.encode(group_id=group, topics=tuple(
                rq("AlterShareGroupOffsetsRequestTopic", topic_name=t, partitions=tuple(
                    rq("AlterShareGroupOffsetsRequestPartition", partition_index=p, start_offset=o) for p, o in ps))
                for t, ps in by_topic.items()))

        r = await self._at_coordinator(group, ApiKey.ALTER_SHARE_GROUP_OFFSETS, build, lambda r: r.error_code)
        if int(r.error_code):
            raise AdminError(r.error_code, f"alter the share offsets of group {group}", r.error_message)
        for t in r.responses:
            for p in t.partitions:
                if int(p.error_code):
                    raise AdminError(p.error_code, f"alter the share offset of {group} on "
                                                   f"{t.topic_name}-{p.partition_index}", p.error_message)

    async def delete_share_group_offsets(self, group: str, topics: list[str]
                                         ) -> dict[str, ErrorCode | UnknownErrorCode]:
        """Delete a share group's state of whole `topics` (a group without members); each topic's
        outcome (ErrorCode.NONE: deleted). AdminError for a refusal of the whole request."""
        def build(rq):
            return rq.encode(group_id=group, topics=tuple(
                rq("DeleteShareGroupOffsetsRequestTopic", topic_name=t) for t in dict.fromkeys(topics)))

        r = await self._at_coordinator(group, ApiKey.DELETE_SHARE_GROUP_OFFSETS, build, lambda r: r.error_code)
        if int(r.error_code):
            raise AdminError(r.error_code, f"delete the share offsets of group {group}", r.error_message)
        return {str(t.topic_name): error_code(int(t.error_code)) for t in r.responses}
