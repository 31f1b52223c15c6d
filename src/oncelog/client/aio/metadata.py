"""What the producer knows of topics: which are ready to take records (metadata and message format
loaded) with their partition counts, one TopicPartition object per partition, and the leaders and
connections the cluster reports, passed on to the core."""
from __future__ import annotations

import asyncio
import logging
import threading

from oncelog.client.aio.cluster import Cluster
from oncelog.client.aio.sender import Wakeup
from oncelog.client.config import ProducerConfig
from oncelog.client.producer_core import ProducerCore
from oncelog.client.types import TopicPartition
from oncelog.protocol import metadata
from oncelog.protocol.api import ApiKey
from oncelog.protocol.records import message_format_magic

log = logging.getLogger("oncelog.client.producer")


class ProducerMetadata:
    """`partitions` maps each ready topic to its partition count; sending threads read it
    without a lock (a topic is added once ready, and a count only changes with a refresh)."""

    def __init__(self, core: ProducerCore, lock: threading.Lock, config: ProducerConfig,
                 cluster: Cluster, wakeup: Wakeup) -> None:
        self.core = core
        self.lock = lock
        self.config = config
        self.cluster = cluster
        self.wakeup = wakeup
        self.partitions: dict[str, int] = {}   # topic -> partition count, format checked
        self.is_ours = False                   # the broker speaks Produce v14 (KIP-1269 field)
        self._tasks: dict[str, asyncio.Task] = {}
        self.tps: dict[str, list[TopicPartition]] = {}   # topic -> its partitions, by number
        cluster.listeners.append(self._on_metadata)
        cluster.on_connect.append(self._on_connected)

    def tp(self, topic: str, partition: int) -> TopicPartition:
        """One TopicPartition object per partition (the handoff compares them by identity)."""
        tps = self.tps.get(topic)
        if tps is not None and partition < len(tps):
            return tps[partition]
        old = tps or []   # a new list, swapped in whole: senders may race here
        tps = self.tps[topic] = old + [TopicPartition(topic, i)
                                        for i in range(len(old), partition + 1)]
        return tps[partition]

    def partition_load(self, topic: str, n: int) -> tuple[list[int], list[int]]:
        """The core's queue lengths for the topic's `n` partitions (adaptive partitioning)."""
        tps = self.tps.get(topic) or ()
        return self.core.partition_load(
            [tps[p] if p < len(tps) else TopicPartition(topic, p) for p in range(n)])

    async def ensure_topic(self, topic: str) -> int:
        """Load a topic's metadata and message format once; returns its partition count."""
        n = self.partitions.get(topic)
        if n is not None:
            return n
        t = self._tasks.get(topic)
        if t is None or t.done() and t.exception() is not None:
            t = self._tasks[topic] = asyncio.ensure_future(self._load_topic(topic))
        return await asyncio.shield(t)

    def cancel(self) -> None:
        for t in self._tasks.values():
            t.cancel()

    async def _load_topic(self, topic: str) -> int:
        info = await self.cluster.topic(topic, self.config.max_block_ms / 1000)
        if self.core.idempotent:
            magic = await self._topic_magic(info)
            with self.lock:
                self.core.topic_message_format(topic, magic >= 2, f"v{magic}")
        with self.lock:
            self._on_metadata_topic(info)
        self.partitions[topic] = len(info.partitions)
        return len(info.partitions)

    async def _topic_magic(self, info: metadata.TopicEntry) -> int:
        if info.message_format_magic is not None:
            return info.message_format_magic
        if self.is_ours:
            return 2   # our broker sends tag 10000 whenever the format is below v2
        if self.cluster.version(ApiKey.DESCRIBE_CONFIGS) is None:
            return 2
        from oncelog.client.aio.admin import describe_topic_config
        try:
            cfg = await describe_topic_config(self.cluster, info.name,  # type: ignore[arg-type]  # asked by name
                                              ["message.format.version"])
        except Exception as e:  # noqa: BLE001 - no rights / not supported: assume a modern format
            log.debug("DescribeConfigs for %s failed (%r): assuming message format v2", info.name, e)
            return 2
        return message_format_magic(cfg.get("message.format.version"))

    def _on_metadata(self, info: metadata.MetadataResponse) -> None:
        with self.lock:
            for t in info.topics.values():
                if t.error_code == 0:
                    self._on_metadata_topic(t)
        self.wakeup.set()

    def _on_connected(self, node: int) -> None:
        with self.lock:
            self.core.on_connected(node)   # KIP-1269: this node's partitions start at 5 again

    def _on_metadata_topic(self, t: metadata.TopicEntry) -> None:
        for p in t.partitions:
            # asked by name: the answer names its topics
            self.core.update_leader(TopicPartition(t.name, p.index),  # type: ignore[arg-type]
                                    p.leader_id, p.leader_epoch)
        if t.name in self.partitions:
            self.partitions[t.name] = len(t.partitions)
