"""A single node's topics and partitions: directories `<log dir>/<topic>-<partition>` and the
durable topic registry file (name, topic id, partition count, config overrides); what a topic
registry does with them (configs, the periodic work) is `storage.topic_registry`'s.

The registry is one JSON file per log dir, replaced atomically and durably
(`storage.durable.replace_file`), so a crash leaves either the old or the new registry, never a
mix. A partition directory without a registry entry is logged and left alone.
"""
from __future__ import annotations

import json
import logging
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from oncelog.core.leadership import check_partition_increase
from oncelog.core.topic_config import parse_topic_configs
from oncelog.core.topic_names import invalid_topic_reason, validate_topic_name
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.storage.cleaner import LogCleaner
from oncelog.storage.durable import rename, replace_file
from oncelog.storage.partition import DEFAULT_EXPIRATION_CHECK_INTERVAL_MS, Partition
from oncelog.storage.topic_registry import TopicInfo, TopicRegistry, partition_dir, report_invalid_overrides

log = logging.getLogger(__name__)

REGISTRY = "__oncelog_topics.json"


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


class LogManager(TopicRegistry):
    """A single node's topics and partitions: this broker leads them all (`broker.logs.seam.Logs`);
    the registry file is where its topics come from (`storage.topic_registry`)."""

    def __init__(self, log_dirs: list[str], server_defaults: dict[str, Any],
                 producer_config: dict[str, Any] | None = None, *, node_id: int = 0,
                 expiration_check_interval_ms: int = DEFAULT_EXPIRATION_CHECK_INTERVAL_MS,
                 cleaner: LogCleaner | None = None) -> None:
        super().__init__(server_defaults, producer_config,
                         expiration_check_interval_ms=expiration_check_interval_ms, cleaner=cleaner)
        self.log_dirs = [Path(d) for d in log_dirs]
        self.node_id = node_id
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
                self._add_topic(info)
                report_invalid_overrides(info.name, info.overrides, path)
        recovered = truncated = opened = 0
        for info in self.topics.values():
            for p in range(info.partitions):
                plog = self._open_partition(info, p, now_ms).log
                opened += 1
                if plog.recovered:
                    recovered += 1
                    truncated += plog.truncated_bytes
        if recovered:
            # one line that says the last stop was not clean and what recovery did (Kafka logs
            # its recovery of unflushed segments per partition)
            log.warning("recovery ran after an unclean shutdown: %d of %d partitions were not closed cleanly; "
                        "their active segments were checked batch by batch (CRC) and %d bytes of torn tails "
                        "truncated", recovered, opened, truncated)
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
        self._add_topic(info)
        try:
            self._save_registry(log_dir)
            for p in range(partitions):
                self._open_partition(info, p, now_ms)
        except Exception:
            self._remove_topic(name)
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
        self._remove_topic(name)
        self._save_registry(Path(info.log_dir))
        for p in range(info.partitions):
            directory = partition_dir(Path(info.log_dir), name, p)
            if directory.exists():
                doomed = directory.with_name(f"{directory.name}.{uuid.uuid4().hex}-delete")
                rename(directory, doomed)
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

    def _save_registry(self, log_dir: Path) -> None:
        entries = [_registry_entry(t) for t in self.topics.values() if t.log_dir == str(log_dir)]
        entries += self._invalid.get(str(log_dir), [])
        replace_file(log_dir / REGISTRY, json.dumps(entries, indent=1))
