"""DescribeShareGroupOffsets (API 90), v0-v1 (kafka-share-groups.sh --describe --offsets,
Admin.listShareGroupOffsets): per share-partition of each group named, its start offset (SPSO),
and from v1 its lag (KIP-1226, Kafka 4.2): the partition's high watermark minus the start offset
minus the records between the start and the end that are done with (acknowledged or archived).

As Kafka answers: topics null asks for every share-partition the group has a state for (those on
topics the caller may not DESCRIBE are left out, no error); a topic named that does not exist,
or a partition without a state (never fetched, deleted, or a group id that is no share group),
answers start offset -1 and lag -1 without an error; a named topic the caller may not DESCRIBE
answers TOPIC_AUTHORIZATION_FAILED for each of its partitions. Per group: DESCRIBE on the group
(GROUP_AUTHORIZATION_FAILED), UNSUPPORTED_VERSION while `share.version` is 0, NOT_COORDINATOR on
a broker that does not hold the group's lease (`broker.coordinates`, which drops what a lost lease
left in memory first): the share-partitions live with the group's coordinator.

Bounded per request (as ConsumerGroupDescribe, issue 36): a group named twice is described once
(its other entries INVALID_REQUEST), so is a partition named twice in one group's topics (its
other entries INVALID_REQUEST), and other clients are served between two groups and every
`YIELD_EVERY` share-partitions with a state: each costs a pass over its records in flight
(`group.share.partition.max.record.locks`), everything else a lookup."""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from typing import Any

from oncelog.broker.handlers.api_versions import share_groups_enabled
from oncelog.broker.security.authorization import GROUP, TOPIC, Op, authorize, authorized_names, describable_topics
from oncelog.broker.services import BrokerServices
from oncelog.core.share.partition import ACKNOWLEDGED, ARCHIVED, StateBatch
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS
E = ErrorCode
UNINITIALIZED = -1     # Kafka's UNINITIALIZED_START_OFFSET and UNINITIALIZED_LAG
NO_TOPIC_ID = uuid.UUID(int=0)
YIELD_EVERY = 64


def delivery_complete(start: int, batches: Iterable[StateBatch]) -> int:
    """KIP-1226's deliveryCompleteCount: the offsets from the start on that are done with."""
    return sum(b.last_offset - max(b.first_offset, start) + 1 for b in batches
               if b.state in (ACKNOWLEDGED, ARCHIVED) and b.last_offset >= start)


async def handle(broker: BrokerServices, version: int, r: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    out = []
    seen: set[str] = set()
    for g in r.groups:
        group = str(g.group_id)
        if group in seen:
            out.append(_failed(rb, group, E.INVALID_REQUEST, f"Group {group} is asked for more than once."))
            continue
        seen.add(group)
        if out:
            await asyncio.sleep(0)   # other clients' requests are served between two groups
        if not share_groups_enabled(broker):
            out.append(_failed(rb, group, E.UNSUPPORTED_VERSION, "Share groups are not enabled (share.version is 0)."))
        elif not authorize(broker, Op.DESCRIBE, GROUP, group):
            out.append(_failed(rb, group, E.GROUP_AUTHORIZATION_FAILED))
        elif not broker.coordinates(group):
            out.append(_failed(rb, group, E.NOT_COORDINATOR))
        else:
            out.append(await _describe(broker, rb, group, g.topics))
    return rb.encode(throttle_time=0, groups=tuple(out))


def _failed(rb: entities.ResponseBuilder, group: str, code: int, message: str | None = None) -> Any:
    return rb("DescribeShareGroupOffsetsResponseGroup", group_id=group, topics=(), error_code=code,
              error_message=message)


async def _describe(broker: BrokerServices, rb: entities.ResponseBuilder, group: str, topics: Any) -> Any:
    share = broker.groups.share
    asked: dict[str, dict[int, None]] = {}   # topic -> partitions, in the request's order
    repeated: dict[str, list[int]] = {}
    denied: list[tuple[str, tuple[int, ...]]] = []
    if topics is None:   # every share-partition with a state, on topics the caller may describe
        names: dict[uuid.UUID, str | None] = {}
        for tid, p in sorted(share.initialized(group), key=lambda k: (str(k[0]), k[1])):
            if tid not in names:
                names[tid] = broker.logs.topic_name(tid)
            name = names[tid]
            if name is not None:
                asked.setdefault(name, {})[p] = None
        shown = describable_topics(broker, asked)
        asked = {t: ps for t, ps in asked.items() if t in shown}
    else:
        allowed = authorized_names(broker, Op.DESCRIBE, TOPIC, (str(t.topic_name) for t in topics))
        for t in topics:
            name = str(t.topic_name)
            if name not in allowed:
                denied.append((name, tuple(int(p) for p in t.partitions)))
                continue
            have = asked.setdefault(name, {})
            for p in map(int, t.partitions):
                if p in have:
                    repeated.setdefault(name, []).append(p)
                else:
                    have[p] = None
    described = 0
    answers = []
    for name, partitions in asked.items():
        info = broker.logs.topics.get(name)
        parts = []
        for p in partitions:
            state = share.summary(group, info.topic_id, p) if info is not None else None
            if state is None:
                parts.append(rb("DescribeShareGroupOffsetsResponsePartition", partition_index=p,
                                start_offset=UNINITIALIZED, leader_epoch=0, lag=UNINITIALIZED, error_code=E.NONE))
                continue
            described += 1
            if described % YIELD_EVERY == 0:
                await asyncio.sleep(0)
            leader_epoch, lag = 0, UNINITIALIZED
            partition = broker.logs.get_partition(name, p)
            if partition is not None:   # (the lag needs the partition's high watermark: where it is led)
                leader_epoch = broker.logs.leader(name, p)[1]
                lag = max(0, partition.high_watermark - state.start_offset
                          - delivery_complete(state.start_offset, state.batches))
            parts.append(rb("DescribeShareGroupOffsetsResponsePartition", partition_index=p,
                            start_offset=state.start_offset, leader_epoch=leader_epoch, lag=lag, error_code=E.NONE))
        for p in repeated.get(name, ()):
            parts.append(rb("DescribeShareGroupOffsetsResponsePartition", partition_index=p,
                            start_offset=UNINITIALIZED, leader_epoch=0, lag=UNINITIALIZED,
                            error_code=E.INVALID_REQUEST, error_message=f"{name}-{p} is asked for more than once."))
        answers.append(rb("DescribeShareGroupOffsetsResponseTopic", topic_name=name,
                          topic_id=info.topic_id if info is not None else NO_TOPIC_ID, partitions=tuple(parts)))
    for name, indexes in denied:
        answers.append(rb("DescribeShareGroupOffsetsResponseTopic", topic_name=name, topic_id=NO_TOPIC_ID,
                          partitions=tuple(rb("DescribeShareGroupOffsetsResponsePartition", partition_index=p,
                                              start_offset=UNINITIALIZED, leader_epoch=0, lag=UNINITIALIZED,
                                              error_code=E.TOPIC_AUTHORIZATION_FAILED)
                                           for p in indexes)))
    return rb("DescribeShareGroupOffsetsResponseGroup", group_id=group, topics=tuple(answers), error_code=E.NONE,
              error_message=None)


def error_response(version: int, request: Any, code: int) -> bytes:
    """Kafka's getErrorResponse: the error for every group, no topics."""
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode(throttle_time=0, groups=tuple(_failed(rb, str(g.group_id), code) for g in request.groups))
