"""What request handlers see of a broker's topics and partitions (`Broker.logs`).

Two implementations: a single node's `storage.log_manager.LogManager`, which owns every partition
of its registry, and a cluster member's `broker.logs.cluster_logs.ClusterLogs`, which opens the
partitions the controller says it leads and forwards topic changes to the controller. Topic
changes are coroutines in both, so a handler awaits them the same way whichever it has.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.metadata import BrokerEntry
from oncelog.storage.marker_append import Durability
from oncelog.storage.partition import Partition
from oncelog.storage.topic_registry import TopicInfo


class Logs(Protocol):
    topics: dict[str, TopicInfo]
    # How a marker is acknowledged durable, and the clock it is stamped with (the broker sets
    # both: storage.marker_append.MarkerWriting)
    durable: Durability | None
    clock_ms: Callable[[], int]
    # The other brokers of the cluster as the controller last described them (this one may be
    # missing until its first heartbeat); empty on a single node.
    brokers: list[BrokerEntry]

    async def open(self, now_ms: int) -> None: ...
    async def close(self) -> None: ...

    def get_partition(self, topic: str, index: int) -> Partition | None:
        """The partition if this broker leads it."""
    def partition_error(self, topic: str, index: int) -> ErrorCode:
        """Why `get_partition` found nothing: UNKNOWN_TOPIC_OR_PARTITION or NOT_LEADER_OR_FOLLOWER."""
    def leader(self, topic: str, index: int) -> tuple[int, int]:
        """(leader's node id, leader epoch); node id -1 when no broker leads it."""
    def partitions(self) -> Iterator[Partition]: ...
    def topic_name(self, topic_id: uuid.UUID | None) -> str | None: ...
    def topic_config(self, name: str) -> dict[str, Any]:
        """Every topic config of `name`, typed (`core.topic_config.effective_topic_config`)."""

    async def create_topic(self, name: str, partitions: int, overrides: dict[str, str],
                           now_ms: int) -> TopicInfo: ...
    async def create_partitions(self, name: str, count: int, assignments: list[list[int]] | None,
                                now_ms: int, validate_only: bool = False) -> None:
        """Grow a topic to `count` partitions (CreatePartitions); `assignments`: one broker list
        per new partition, or None to let the cluster place them."""
    async def delete_topic(self, name: str) -> None: ...
    async def alter_topic_config(self, name: str, set_: dict[str, str], delete: list[str]) -> None: ...
    def set_server_defaults(self, defaults: dict[str, Any]) -> None:
        """New broker-wide topic defaults (dynamic broker configs): topics without their own
        override follow at once."""

    async def write_txn_marker(self, topic: str, partition: int, producer_id: int, producer_epoch: int,
                               coordinator_epoch: int, commit: bool, transaction_version: int = 0) -> ErrorCode:
        """Append a COMMIT (commit=True) or ABORT marker to a partition this broker leads and
        answer once it is fsynced (`storage.marker_append`; no network). Codes: NONE,
        NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, INVALID_PRODUCER_EPOCH,
        TRANSACTION_COORDINATOR_FENCED, UNSUPPORTED_FOR_MESSAGE_FORMAT, KAFKA_STORAGE_ERROR."""

    def tick(self, now_ms: int, flush: Callable[[Partition], None] | None = None) -> None:
        """Retention, the flush policy and producer expiry (`storage.topic_registry.maintain`)."""
