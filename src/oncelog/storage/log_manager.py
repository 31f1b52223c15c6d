"""All partitions of a broker: directories `<log dir>/<topic>-<partition>`, a durable topic
registry (name, topic id, partition count, config overrides) and the periodic work (retention,
flush policy, producer-id expiry).

The registry is one JSON file per log dir, replaced atomically (write, fsync, rename, fsync the
directory), so a crash leaves either the old or the new registry, never a mix. A partition
directory without a registry entry is logged and left alone.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncelog.core.leadership import check_partition_increase
from oncelog.core.topic_config import effective_topic_config, invalid_topic_configs, parse_topic_configs
from oncelog.core.topic_names import invalid_topic_reason, validate_topic_name
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.metadata import BrokerEntry
from oncelog.storage.cleaner import LogCleaner
from oncelog.storage.fence import Busy, Fenced
from oncelog.storage.marker_append import MarkerWriting
from oncelog.storage.partition import DEFAULT_EXPIRATION_CHECK_INTERVAL_MS, Partition, PartitionConfig

log = logging.getLogger(__name__)

REGISTRY = "__oncelog_topics.json"


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


class RegistryDamaged(Exception):
    """The topic registry does not read (written atomically, so damaged from outside): the broker
    must not start and forget the topics it lists."""


def _read_registry(path: Path, log_dir: str) -> list[TopicInfo]:
    try:
        return [TopicInfo(t["name"], uuid.UUID(t["topic_id"]), t["partitions"], t.get("overrides", {}), log_dir)
                for t in json.loads(path.read_text())]
    except (ValueError, KeyError, TypeError) as e:
        raise RegistryDamaged(
            f"{path} is damaged ({type(e).__name__}: {e}): restore it from a backup; it names the topics, their "
            "ids and configs (their records are in the partition directories beside it)") from None


def _registry_entry(t: TopicInfo) -> dict[str, Any]:
    return {"name": t.name, "topic_id": str(t.topic_id), "partitions": t.partitions, "overrides": t.overrides}


class LogManager(MarkerWriting):
    """A single node's topics and partitions: this broker leads them all (`broker.logs.seam.Logs`)."""

    def __init__(self, log_dirs: list[str], server_defaults: dict[str, Any],
                 producer_config: dict[str, Any] | None = None, *, node_id: int = 0,
                 expiration_check_interval_ms: int = DEFAULT_EXPIRATION_CHECK_INTERVAL_MS,
                 cleaner: LogCleaner | None = None) -> None:
        self.log_dirs = [Path(d) for d in log_dirs]
        self.cleaner = cleaner if cleaner is not None else LogCleaner()
        self.server_defaults = dict(server_defaults)
        self.producer_config = dict(producer_config or {})
        self.node_id = node_id
        self.expiration_check_interval_ms = expiration_check_interval_ms
        self.topics: dict[str, TopicInfo] = {}
        self.brokers: list[BrokerEntry] = []  # no other broker: Metadata answers with this one
        self._by_id: dict[uuid.UUID, str] = {}
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._invalid: dict[str, list[dict[str, Any]]] = {}  # registry entries whose name is invalid, by log dir

    # ------------------------------------------------------------------ open / close
    async def open(self, now_ms: int) -> None:
        for d in self.log_dirs:
            d.mkdir(parents=True, exist_ok=True)
            path = d / REGISTRY
            if not path.exists():
                continue
            for info in _read_registry(path, str(d)):
                reason = invalid_topic_reason(info.name)
                if reason is not None:  # (written before names were checked): kept, never opened
                    log.error("%s: topic %r is not opened: its name is invalid (%s); its entry and files are "
                              "left as they are", path, info.name, reason)
                    self._invalid.setdefault(str(d), []).append(_registry_entry(info))
                    continue
                self.topics[info.name] = info
                self._by_id[info.topic_id] = info.name
                report_invalid_overrides(info.name, info.overrides, path)
        for info in self.topics.values():
            for p in range(info.partitions):
                self._open_partition(info, p, now_ms)
        known = {f"{t.name}-{p}" for t in self.topics.values() for p in range(t.partitions)}
        for d in self.log_dirs:
            for child in d.iterdir():
                if child.is_dir() and re.match(r".+-\d+$", child.name) and child.name not in known:
                    log.warning("%s: a partition directory with no topic in the registry; left alone", child)

    def _open_partition(self, info: TopicInfo, index: int, now_ms: int) -> Partition:
        directory = partition_dir(Path(info.log_dir), info.name, index)
        partition = Partition.open(info.name, index, directory, self._partition_config(info.name), now_ms)
        self._partitions[(info.name, index)] = partition
        return partition

    async def close(self) -> None:
        self.cleaner.close()
        for key, partition in list(self._partitions.items()):
            try:
                partition.close()
            except Exception:
                log.exception("closing partition %s-%d failed", *key)
        self._partitions.clear()

    # ------------------------------------------------------------------ lookups
    def get_partition(self, topic: str, index: int) -> Partition | None:
        return self._partitions.get((topic, index))

    def partition_error(self, topic: str, index: int) -> ErrorCode:
        """Why `get_partition` found nothing (a cluster answers NOT_LEADER_OR_FOLLOWER instead)."""
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    def leader(self, topic: str, index: int) -> tuple[int, int]:
        return self.node_id, 0

    def partitions(self) -> Iterator[Partition]:
        return iter(list(self._partitions.values()))

    def topic_name(self, topic_id: uuid.UUID | None) -> str | None:
        return self._by_id.get(topic_id) if topic_id is not None else None

    def topic_config(self, name: str) -> dict[str, Any]:
        return effective_topic_config(self.server_defaults, self.topics[name].overrides)

    def _partition_config(self, name: str) -> PartitionConfig:
        return PartitionConfig.from_topic_config({**self.topic_config(name), **self.producer_config})

    # ------------------------------------------------------------------ changes
    async def create_topic(self, name: str, partitions: int, overrides: dict[str, str], now_ms: int) -> TopicInfo:
        validate_topic_name(name)
        if name in self.topics:
            raise KafkaProtocolError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        if partitions < 1:
            raise KafkaProtocolError(ErrorCode.INVALID_PARTITIONS, f"{partitions} partitions")
        parse_topic_configs(overrides)
        log_dir = min(self.log_dirs, key=lambda d: sum(
            t.partitions for t in self.topics.values() if t.log_dir == str(d)))
        info = TopicInfo(name, uuid.uuid4(), partitions, {k: str(v) for k, v in overrides.items()}, str(log_dir))
        self.topics[name] = info
        self._by_id[info.topic_id] = name
        try:
            self._save_registry(log_dir)
            for p in range(partitions):
                self._open_partition(info, p, now_ms)
        except Exception:
            self.topics.pop(name, None)
            self._by_id.pop(info.topic_id, None)
            raise
        log.info("created topic %s (%s) with %d partitions%s", name, info.topic_id, partitions,
                 f", overrides {info.overrides}" if info.overrides else "")
        return info

    async def create_partitions(self, name: str, count: int, assignments: list[list[int]] | None,
                                now_ms: int, validate_only: bool = False) -> None:
        """Grow `name` to `count` partitions. The registry is saved first: a crash before the new
        directories exist leaves partitions that open empty at the next start."""
        info = self.topics.get(name)
        if info is None:
            raise KafkaProtocolError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
        check_partition_increase(name, info.partitions, count, assignments, {self.node_id})
        if validate_only:
            return
        old = info.partitions
        info.partitions = count
        try:
            self._save_registry(Path(info.log_dir))
        except Exception:
            info.partitions = old
            raise
        for p in range(old, count):
            self._open_partition(info, p, now_ms)
        log.info("topic %s: %d partitions, was %d", name, count, old)

    async def delete_topic(self, name: str) -> None:
        info = self.topics.get(name)
        if info is None:
            raise KafkaProtocolError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
        for p in range(info.partitions):
            partition = self._partitions.pop((name, p), None)
            if partition is not None:
                partition.close()
        del self.topics[name]
        self._by_id.pop(info.topic_id, None)
        self._save_registry(Path(info.log_dir))
        for p in range(info.partitions):
            directory = partition_dir(Path(info.log_dir), name, p)
            if directory.exists():
                doomed = directory.with_name(f"{directory.name}.{uuid.uuid4().hex}-delete")
                directory.rename(doomed)
                shutil.rmtree(doomed, ignore_errors=True)
        log.info("deleted topic %s", name)

    async def alter_topic_config(self, name: str, set_: dict[str, str], delete: list[str]) -> None:
        info = self.topics.get(name)
        if info is None:
            raise KafkaProtocolError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
        parse_topic_configs(set_)
        for key in delete:
            parse_topic_configs({key: None})
        overrides = {**info.overrides, **{k: str(v) for k, v in set_.items()}}
        for key in delete:
            overrides.pop(key, None)
        info.overrides = overrides
        self._save_registry(Path(info.log_dir))
        self._apply_config(name)
        log.info("topic %s: config overrides now %s", name, overrides)

    def set_server_defaults(self, defaults: dict[str, Any]) -> None:
        self.server_defaults = dict(defaults)
        for name in self.topics:
            self._apply_config(name)

    def _apply_config(self, name: str) -> None:
        config = self._partition_config(name)
        for p in range(self.topics[name].partitions):
            partition = self._partitions.get((name, p))
            if partition is not None:
                partition.update_config(config)

    def _save_registry(self, log_dir: Path) -> None:
        entries = [_registry_entry(t) for t in self.topics.values() if t.log_dir == str(log_dir)]
        entries += self._invalid.get(str(log_dir), [])
        path = log_dir / REGISTRY
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(entries, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(log_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ periodic work
    def tick(self, now_ms: int, flush: Callable[[Partition], None] | None = None) -> None:
        maintain(list(self._partitions.values()), now_ms, flush, self.expiration_check_interval_ms, self.cleaner)

