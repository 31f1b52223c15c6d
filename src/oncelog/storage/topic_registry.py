"""The topics a broker knows and what follows from them for the partitions it has open: the one
topic registry of both `broker.logs.seam.Logs` implementations.

A topic is a `TopicInfo` (name, id, partition count, config overrides, log dir). `TopicRegistry`
keeps them by name and by id, under the broker-wide topic defaults, and derives from them what a
partition is configured with; when a default or an override changes, the partitions it has open
follow at once; its `tick` is the periodic work on them (`maintain`). Where the topics come from
is the subclass's business, and so is which partitions are open:
- `storage.log_manager.LogManager` (a single node) keeps them in its registry file and opens
  every partition of every topic;
- `broker.logs.cluster_logs.ClusterLogs` (a cluster member) takes them from the controller's
  view and opens the partitions the controller says it leads.
"""
from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncelog.core.topic_config import effective_topic_config, invalid_topic_configs
from oncelog.core.topic_names import validate_topic_name
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.metadata import BrokerEntry
from oncelog.storage.cleaner import LogCleaner
from oncelog.storage.fence import Busy, Fenced
from oncelog.storage.marker_append import MarkerWriting
from oncelog.storage.partition import DEFAULT_EXPIRATION_CHECK_INTERVAL_MS, Partition, PartitionConfig

log = logging.getLogger(__name__)


@dataclass
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    overrides: dict[str, str] = field(default_factory=dict)
    log_dir: str = ""


def partition_dir(log_dir: Path, topic: str, index: int) -> Path:
    """`<log dir>/<topic>-<index>`, the only way a partition's path is made: a name that is not a
    legal topic name (`../x`) is refused here too, whoever let it through."""
    if index < 0:
        raise KafkaProtocolError(ErrorCode.INVALID_PARTITIONS, f"partition {index} of {topic!r}")
    return log_dir / f"{validate_topic_name(topic)}-{index}"


def report_invalid_overrides(topic: str, overrides: dict[str, Any], where: Any) -> None:
    """A stored override that no longer validates must not stop a start: say so, use the default."""
    for name, why in invalid_topic_configs(overrides).items():
        log.error("topic %s: stored config %s=%r (%s) is invalid: %s; using the default until it is "
                  "altered or deleted", topic, name, overrides[name], where, why)


def maintain(partitions: Iterable[Partition], now_ms: int, flush: Callable[[Partition], None] | None,
             expiration_check_interval_ms: int, cleaner: LogCleaner | None = None) -> None:
    """The periodic work on each partition: retention, the flush policy, producer expiry and
    the log cleaner's passes (on its own thread; started and swapped in from here).
    `flush(partition)`: who runs a due fsync (the broker's group commit, off the event loop);
    None: here and now."""
    partitions = list(partitions)
    if cleaner is not None:
        try:
            cleaner.tick(partitions, now_ms)
        except Exception:
            log.exception("log cleaner pass failed; will retry")
    for partition in partitions:
        try:
            partition.enforce_retention(now_ms)
            if flush is None:
                partition.maybe_flush(now_ms)
            elif partition.flush_due(now_ms):
                flush(partition)
            partition.tick(now_ms, expiration_check_interval_ms)
        except KafkaProtocolError as e:
            log.warning("partition %s-%d maintenance: %s", partition.topic, partition.index, e)
        except (Fenced, Busy) as e:   # a newer owner has it (the broker drops it), or is taking it now
            log.info("partition %s-%d maintenance skipped: %s", partition.topic, partition.index, e)


class TopicRegistry(MarkerWriting):
    """Topics by name and id, their configs, and the partitions open from them (subclasses say
    which: `partitions`)."""

    def __init__(self, server_defaults: dict[str, Any], producer_config: dict[str, Any] | None = None, *,
                 expiration_check_interval_ms: int = DEFAULT_EXPIRATION_CHECK_INTERVAL_MS,
                 cleaner: LogCleaner | None = None) -> None:
        self.server_defaults = dict(server_defaults)
        self.producer_config = dict(producer_config or {})
        self.expiration_check_interval_ms = expiration_check_interval_ms
        self.cleaner = cleaner if cleaner is not None else LogCleaner()
        self.topics: dict[str, TopicInfo] = {}
        self.brokers: list[BrokerEntry] = []  # the cluster's other brokers; none on a single node
        self._by_id: dict[uuid.UUID, str] = {}

    def partitions(self) -> Iterator[Partition]:
        """The partitions this broker has open."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the topics
    def _add_topic(self, info: TopicInfo) -> None:
        self.topics[info.name] = info
        self._by_id[info.topic_id] = info.name

    def _remove_topic(self, name: str) -> TopicInfo | None:
        info = self.topics.pop(name, None)
        if info is not None:
            self._by_id.pop(info.topic_id, None)
        return info

    def _set_topics(self, infos: dict[str, TopicInfo]) -> None:
        self.topics = infos
        self._by_id = {i.topic_id: n for n, i in infos.items()}

    def topic_name(self, topic_id: uuid.UUID | None) -> str | None:
        return self._by_id.get(topic_id) if topic_id is not None else None

    # ------------------------------------------------------------------ their configs
    def topic_config(self, name: str) -> dict[str, Any]:
        return effective_topic_config(self.server_defaults, self.topics[name].overrides)

    def _partition_config(self, name: str) -> PartitionConfig:
        return PartitionConfig.from_topic_config({**self.topic_config(name), **self.producer_config})

    def set_server_defaults(self, defaults: dict[str, Any]) -> None:
        self.server_defaults = dict(defaults)
        for name in list(self.topics):
            self._apply_config(name)

    def _apply_config(self, name: str) -> None:
        """The topic's config changed: its open partitions take it now."""
        config = self._partition_config(name)
        for partition in self.partitions():
            if partition.topic == name:
                partition.update_config(config)

    # ------------------------------------------------------------------ periodic work
    def tick(self, now_ms: int, flush: Callable[[Partition], None] | None = None) -> None:
        maintain(self.partitions(), now_ms, flush, self.expiration_check_interval_ms, self.cleaner)
