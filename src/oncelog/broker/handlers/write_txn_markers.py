"""WriteTxnMarkers (API 27, v1-v2): a coordinator asks this broker to append COMMIT/ABORT markers to
partitions it leads (Kafka's KafkaApis.handleWriteTxnMarkersRequest). v2 (KIP-1228) carries each
marker's transaction version: a Transactions V2 marker needs an epoch above the producer's while
its transaction is open in the partition (v1 markers are taken as Transactions V1's). Each partition is written
through `Logs.write_txn_marker`, the same path the local marker writer calls, and answered once its
marker is fsynced; the partitions of one request are written concurrently, so one group-commit
fsync covers the markers that share a partition's log.

Per partition: NONE, NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, INVALID_PRODUCER_EPOCH,
TRANSACTION_COORDINATOR_FENCED, UNSUPPORTED_FOR_MESSAGE_FORMAT, KAFKA_STORAGE_ERROR
(`core.txn.marker_progress.classify` says what each means to the writer). Only another broker of the
cluster may send it (`authorization.require_broker`: the cluster credential's principal, which holds
CLUSTER_ACTION implicitly), else CLUSTER_AUTHORIZATION_FAILED for every partition: a marker written
by anyone else would end another producer's transaction. A `__consumer_offsets` partition is the group coordinator's
(`broker.txn.marker_writer.offsets_marker`: checked as a data partition checks a marker, then the groups'
pending transactional offsets made visible or dropped).
"""
from __future__ import annotations

import asyncio
from typing import Any

from oncelog.broker.security.authorization import require_broker
from oncelog.broker.services import BrokerServices
from oncelog.broker.txn.marker_writer import offsets_marker
from oncelog.core.txn.log_format import CONSUMER_OFFSETS_TOPIC
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey

API_KEY = ApiKey.WRITE_TXN_MARKERS


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    require_broker(broker, "WriteTxnMarkers")
    rb = entities.ResponseBuilder(API_KEY, version)
    jobs = []
    for m in request.markers:
        for t in m.topics:
            for index in t.partition_indexes:
                version_of_txn = int(getattr(m, "transaction_version", 0))
                if str(t.name) == CONSUMER_OFFSETS_TOPIC:
                    jobs.append(_now(offsets_marker(broker, int(m.producer_id), int(m.producer_epoch),
                                                    int(m.coordinator_epoch), bool(m.transaction_result),
                                                    int(index), version_of_txn)))
                    continue
                jobs.append(broker.logs.write_txn_marker(
                    str(t.name), int(index), int(m.producer_id), int(m.producer_epoch),
                    int(m.coordinator_epoch), bool(m.transaction_result), version_of_txn))
    codes = iter(await asyncio.gather(*jobs))
    markers = []
    for m in request.markers:
        topics = []
        for t in m.topics:
            parts = []
            for index in t.partition_indexes:
                code = next(codes)
                parts.append(rb("WritableTxnMarkerPartitionResult", partition_index=index, error_code=code))
            topics.append(rb("WritableTxnMarkerTopicResult", name=t.name, partitions=tuple(parts)))
        markers.append(rb("WritableTxnMarkerResult", producer_id=m.producer_id, topics=tuple(topics)))
    return rb.encode(markers=tuple(markers))


async def _now(code: int) -> int:
    return code


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode(markers=tuple(
        rb("WritableTxnMarkerResult", producer_id=m.producer_id, topics=tuple(
            rb("WritableTxnMarkerTopicResult", name=t.name, partitions=tuple(
                rb("WritableTxnMarkerPartitionResult", partition_index=i, error_code=code)
                for i in t.partition_indexes))
            for t in m.topics))
        for m in request.markers))
