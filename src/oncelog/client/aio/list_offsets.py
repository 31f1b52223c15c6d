"""ListOffsets for the consumer and the admin client: each partition asked of its leader, a
lost connection retried after a metadata refresh."""
from __future__ import annotations

import asyncio

from oncelog.client.aio import wire
from oncelog.client.aio.cluster import Cluster
from oncelog.client.aio.connection import BrokerConnectionError
from oncelog.client.errors import KafkaClientError
from oncelog.client.types import TopicPartition
from oncelog.protocol.api import ApiKey
from oncelog.protocol.entities import RequestBuilder
from oncelog.protocol.errors import error_code


async def leader_of(cluster: Cluster, tp: TopicPartition) -> int:
    t = await cluster.topic(tp.topic, cluster.timeout_s)
    if tp.partition >= len(t.partitions):
        raise KafkaClientError(f"{tp.topic} has no partition {tp.partition}")
    return t.partitions[tp.partition].leader_id


async def list_offsets(cluster: Cluster, tps, timestamp, isolation_level: int = 0
                       ) -> dict[TopicPartition, int | None]:
    """`timestamp` is EARLIEST, LATEST, a time in ms, or a dict {tp: timestamp}; None where no
    record is at or after that time."""
    by_leader: dict[int, list[tuple[TopicPartition, int]]] = {}
    for tp in tps:
        key = TopicPartition(tp[0], tp[1])
        ts = timestamp[tp] if isinstance(timestamp, dict) else timestamp
        by_leader.setdefault(await leader_of(cluster, key), []).append((key, ts))
    out: dict[TopicPartition, int | None] = {}
    for leader, items in by_leader.items():
        for attempt in range(5):
            try:
                out.update(await _list_offsets_at(cluster, leader, items, isolation_level))
                break
            except (TimeoutError, BrokerConnectionError):
                if attempt == 4:
                    raise
                await cluster.refresh([tp.topic for tp, _ in items])
                await asyncio.sleep(0.05 * (attempt + 1))
    return out


async def _list_offsets_at(cluster: Cluster, leader: int, items, isolation_level: int):
    conn = await cluster.connection(leader)
    v = conn.version(ApiKey.LIST_OFFSETS)
    if v is None:
        raise KafkaClientError("broker does not support ListOffsets v1+")
    rq = RequestBuilder(ApiKey.LIST_OFFSETS, v)
    topics: dict[str, list] = {}
    for tp, ts in items:
        topics.setdefault(tp.topic, []).append(
            rq("ListOffsetsPartition", partition_index=tp.partition, timestamp=ts,
               current_leader_epoch=-1, max_num_offsets=1))
    req = rq.encode(replica_id=-1, isolation_level=isolation_level, topics=tuple(
        rq("ListOffsetsTopic", name=t, partitions=tuple(ps)) for t, ps in topics.items()))
    body = await asyncio.wait_for(conn.request(ApiKey.LIST_OFFSETS, v, req), cluster.timeout_s)
    r = wire.decode(ApiKey.LIST_OFFSETS, v, body)
    out = {}
    for t in r.topics:
        for p in t.partitions:
            if p.error_code:
                raise KafkaClientError(f"ListOffsets {t.name}-{p.partition_index}: "
                                       f"{error_code(p.error_code).name}")
            out[TopicPartition(t.name, p.partition_index)] = None if p.offset < 0 else p.offset
    return out
