"""DescribeLogDirs (API 35), v1-v4: each of this broker's log directories, the partitions it
leads in each (bytes on disk, and how far the log end runs ahead of the high watermark, Kafka's
offset lag), and from v4 the volume's total and usable bytes (KIP-827), what kafka-log-dirs.sh
--describe and `rpk cluster logdirs describe` show. Needs DESCRIBE on the cluster: v3+ answer
CLUSTER_AUTHORIZATION_FAILED, v1-v2 (which have no error code) an empty list, as Kafka does.
No replica is ever a future one (AlterReplicaLogDirs is not served)."""
from __future__ import annotations

import os
import shutil
from typing import Any

from oncelog.broker.security.authorization import authorize_cluster
from oncelog.broker.services import BrokerServices
from oncelog.core.security.acl import AclOperation as Op
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DESCRIBE_LOG_DIRS
FIRST_TOP_LEVEL_ERROR = 3


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    if not authorize_cluster(broker, Op.DESCRIBE):
        code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED if version >= FIRST_TOP_LEVEL_ERROR else ErrorCode.NONE
        return rb.encode(throttle_time=0, error_code=code, results=())
    wanted: dict[str, set[int] | None] | None = None
    if request.topics is not None:
        wanted = {str(t.topic): {int(p) for p in t.partitions} for t in request.topics}
    by_dir: dict[str, dict[str, list[Any]]] = {os.path.abspath(d): {} for d in broker.config.log_dirs}
    for p in broker.logs.partitions():
        if wanted is not None and (p.topic not in wanted or p.index not in (wanted[p.topic] or ())):
            continue
        info = broker.logs.topics.get(p.topic)
        directory = os.path.abspath(info.log_dir) if info is not None and info.log_dir else next(iter(by_dir))
        by_dir.setdefault(directory, {}).setdefault(p.topic, []).append(rb(
            "DescribeLogDirsPartition", partition_index=p.index, partition_size=p.log.size_bytes,
            offset_lag=max(0, p.log_end_offset - p.high_watermark), is_future_key=False))
    results = []
    for directory, topics in sorted(by_dir.items()):
        try:
            usage = shutil.disk_usage(directory)
            code, total, usable = ErrorCode.NONE, usage.total, usage.free
        except OSError:
            code, total, usable = ErrorCode.KAFKA_STORAGE_ERROR, -1, -1
        results.append(rb("DescribeLogDirsResult", error_code=code, log_dir=directory, total_bytes=total,
                          usable_bytes=usable, topics=tuple(
                              rb("DescribeLogDirsTopic", name=t, partitions=tuple(
                                  sorted(parts, key=lambda x: int(x.partition_index))))
                              for t, parts in sorted(topics.items()))))
    return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, results=tuple(results))
