"""A broker's partitions in a cluster on one machine: the controller decides who leads what; this
module follows its view and opens exactly the partitions this broker leads.

Storage is shared (every broker's `log.dirs` is the same directory), so a partition moves by
handing over its directory. Ownership is a fenced lease, never a view (docs/cluster.md): the new
leader raises the partition's token to its leader epoch (`storage.fence`) — without waiting for
the old leader, which may be paused — then recovers log and producer state from the directory
and appends with the new leader epoch. Every write of a leader is checked against the token, so
the old leader, even one that resumes from a pause still believing it leads, writes nothing more;
it drops the partition (closed without a write) as soon as its view names another leader or the
token moved (`get_partition` reads the token before anything is served from the partition).
Two brokers never write one partition.

What handlers see of it is `broker.logs.seam.Logs`, as of a single node's `LogManager`; topic changes
are forwarded to the controller and answered once this broker's view shows them.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from oncelog.broker.cluster.controller_client import ControllerClient, ControllerUnavailable
from oncelog.core.topic_config import parse_topic_configs
from oncelog.core.topic_names import CONSUMER_OFFSETS_TOPIC, invalid_topic_reason, validate_topic_name
from oncelog.protocol import entities
from oncelog.protocol import metadata as md
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.storage.cleaner import LogCleaner
from oncelog.storage.fence import TOKEN_FILE, Busy, Fenced, Lease
from oncelog.storage.partition import DEFAULT_EXPIRATION_CHECK_INTERVAL_MS, Partition
from oncelog.storage.topic_registry import TopicInfo, TopicRegistry, partition_dir, report_invalid_overrides

log = logging.getLogger(__name__)

TAG_TOPIC_OVERRIDES = 10001
POLL_S = 0.1


class _Led:
    """A partition this broker has open, under the lease (its token at `epoch`) that makes it
    the only writer."""

    def __init__(self, partition: Partition, epoch: int) -> None:
        self.partition, self.epoch = partition, epoch


class ClusterLogs(TopicRegistry):
    """The topics of the controller's view (`storage.topic_registry`) and the partitions of them
    this broker leads."""

    def __init__(self, log_dir: str, server_defaults: dict[str, Any], producer_config: dict[str, Any],
                 client: ControllerClient, node_id: int, now_ms: Callable[[], int], *,
                 expiration_check_interval_ms: int = DEFAULT_EXPIRATION_CHECK_INTERVAL_MS,
                 cleaner: LogCleaner | None = None) -> None:
        super().__init__(server_defaults, producer_config,
                         expiration_check_interval_ms=expiration_check_interval_ms, cleaner=cleaner)
        self.log_dir = Path(log_dir)
        self.client = client
        self.node_id = node_id
        self.now_ms = now_ms
        self.leaders: dict[tuple[str, int], tuple[int, int]] = {}
        self._invalid: set[str] = set()   # names in the controller's view that no topic may have
        self._led: dict[tuple[str, int], _Led] = {}
        self._task: asyncio.Task | None = None
        self._changed = asyncio.Event()
        # called after each new view: the coordinators follow leadership as the partitions do
        self.on_view: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ lifecycle
    async def open(self, now_ms: int) -> None:
        """Take the controller's view once (opening the partitions it says this broker leads),
        then follow it."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        await self.refresh()
        self._task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            try:
                await self.refresh()
            except ControllerUnavailable as e:
                log.warning("cannot reach the controller for the cluster view: %s", e)
            except Exception:
                log.exception("following the controller's view failed; will retry")
            await asyncio.sleep(POLL_S)

    async def refresh(self) -> None:
        body = await self.client.raw(ApiKey.METADATA, 12, md.encode_request(12, None))
        view = md.decode_response(12, body)
        self.brokers = list(view.brokers.values())
        infos, leaders, changed = {}, {}, []
        for t in view.topics.values():
            assert t.name is not None  # asked for all topics, the controller names each
            reason = invalid_topic_reason(t.name)
            if reason is not None:  # recorded by a controller that did not check names
                if t.name not in self._invalid:
                    self._invalid.add(t.name)
                    log.error("the controller's view has a topic %r whose name is invalid (%s): not opened",
                              t.name, reason)
                continue
            overrides = json.loads((t.extra_tags or {}).get(TAG_TOPIC_OVERRIDES, b"{}"))
            old = self.topics.get(t.name)
            info = TopicInfo(t.name, t.topic_id, len(t.partitions), overrides, str(self.log_dir))
            infos[t.name] = info
            if old is None or old.overrides != overrides:
                report_invalid_overrides(t.name, overrides, "the controller's metadata")
            for p in t.partitions:
                leaders[(t.name, p.index)] = (p.leader_id, p.leader_epoch)
            if old is not None and old.overrides != overrides:
                changed.append(t.name)
        for name in set(self.topics) - set(infos):
            self._forget_topic(name)
        self._set_topics(infos)
        for name in changed:
            self._apply_config(name)
        self.leaders = leaders
        self._reconcile()
        for follow in self.on_view:
            try:
                follow()
            except Exception:
                log.exception("following the cluster view failed; will retry at the next one")
        self._changed.set()
        self._changed = asyncio.Event()

    def _reconcile(self) -> None:
        now = self.now_ms()
        for key, led in list(self._led.items()):
            leader, epoch = self.leaders.get(key, (-1, -1))
            if leader != self.node_id or epoch != led.epoch:
                log.info("partition %s-%d: leader is now %d (epoch %d); handing it over", *key, leader, epoch)
                self._close(key)
            elif led.partition.fenced:
                self._drop(key)
        for key, (leader, epoch) in self.leaders.items():
            # __consumer_offsets has leaders but no log here: the groups' files are its storage
            # (`broker.groups.ownership` follows its leadership)
            if (leader == self.node_id and key not in self._led and key[0] in self.topics
                    and key[0] != CONSUMER_OFFSETS_TOPIC):
                self._try_open(key, epoch, now)

    def _try_open(self, key: tuple[str, int], epoch: int, now_ms: int) -> None:
        directory = partition_dir(self.log_dir, *key)
        directory.mkdir(parents=True, exist_ok=True)
        try:
            lease = Lease.take(directory / TOKEN_FILE, epoch, f"{key[0]}-{key[1]}")
        except Busy:
            return  # a process is inside one write to it (a paused old leader): again at the next view
        except Fenced as e:
            log.warning("partition %s-%d: not opened: %s (this view is older)", *key, e)
            return
        try:
            partition = Partition.open(key[0], key[1], directory, self._partition_config(key[0]), now_ms,
                                       leader_epoch=epoch, lease=lease)
        except Exception:
            lease.close()
            raise
        self._led[key] = _Led(partition, epoch)
        log.info("partition %s-%d: leading at epoch %d (log end %d, %d producers)", *key, epoch,
                 partition.log_end_offset, partition.producers_tracked)

    def _close(self, key: tuple[str, int]) -> None:
        """Handed over: closed cleanly while the lease holds (a fenced one is dropped)."""
        self._led.pop(key).partition.close()

    def _drop(self, key: tuple[str, int]) -> None:
        """A newer leader raised the token: nothing more is written or served from here."""
        led = self._led.pop(key)
        log.warning("partition %s-%d: a newer leader holds it (epoch %d was ours); dropped", *key, led.epoch)
        led.partition.drop()

    def _forget_topic(self, name: str) -> None:
        for key in [k for k in self._led if k[0] == name]:
            self._close(key)

    async def close(self) -> None:
        self.cleaner.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for key in list(self._led):
            self._close(key)

    # ------------------------------------------------------------------ lookups (broker.logs.seam.Logs)
    def get_partition(self, topic: str, index: int) -> Partition | None:
        """The partition while this broker leads it; the token is read first (a memory load), so
        a broker that was deposed while paused answers NOT_LEADER_OR_FOLLOWER from then on."""
        led = self._led.get((topic, index))
        if led is None:
            return None
        if led.partition.fenced:
            self._drop((topic, index))
            return None
        return led.partition

    def partition_error(self, topic: str, index: int) -> ErrorCode:
        if (topic, index) in self.leaders:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    def leader(self, topic: str, index: int) -> tuple[int, int]:
        return self.leaders.get((topic, index), (-1, 0))

    def partitions(self) -> Iterator[Partition]:
        return iter([led.partition for led in self._led.values()])

    # ------------------------------------------------------------------ changes, through the controller
    async def _forward(self, api_key: int, version: int, **fields: Any):
        try:
            return await self.client.request(api_key, version, **fields)
        except ControllerUnavailable as e:
            raise KafkaProtocolError(ErrorCode.REQUEST_TIMED_OUT, f"controller unreachable: {e}") from None

    async def _until(self, done: Callable[[], bool]) -> None:
        for _ in range(100):
            if done():
                return
            try:
                await asyncio.wait_for(self._changed.wait(), 1)
            except TimeoutError:
                pass

    async def create_topic(self, name: str, partitions: int, overrides: dict[str, str], now_ms: int) -> TopicInfo:
        validate_topic_name(name)
        parse_topic_configs(overrides)
        mod = entities.module(ApiKey.CREATE_TOPICS, 7, "request")
        configs = tuple(entities.make(mod.CreatableTopicConfig, name=k, value=str(v)) for k, v in overrides.items())
        topic = entities.make(mod.CreatableTopic, name=name, num_partitions=partitions, replication_factor=1,
                              assignments=(), configs=configs)
        r = await self._forward(ApiKey.CREATE_TOPICS, 7, topics=(topic,), timeout=30000, validate_only=False)
        result = r.topics[0]
        if int(result.error_code):
            raise KafkaProtocolError(ErrorCode(int(result.error_code)), result.error_message)
        await self._until(lambda: name in self.topics)
        return self.topics[name]

    async def create_partitions(self, name: str, count: int, assignments: list[list[int]] | None,
                                now_ms: int, validate_only: bool = False) -> None:
        mod = entities.module(ApiKey.CREATE_PARTITIONS, 3, "request")
        topic = entities.make(mod.CreatePartitionsTopic, name=name, count=count, assignments=None if assignments is None
                              else tuple(entities.make(mod.CreatePartitionsAssignment, broker_ids=tuple(a))
                                         for a in assignments))
        r = await self._forward(ApiKey.CREATE_PARTITIONS, 3, topics=(topic,), timeout=30000,
                                validate_only=validate_only)
        result = r.results[0]
        if int(result.error_code):
            raise KafkaProtocolError(ErrorCode(int(result.error_code)), result.error_message)
        if not validate_only:
            await self._until(lambda: name in self.topics and self.topics[name].partitions >= count)

    async def delete_topic(self, name: str) -> None:
        mod = entities.module(ApiKey.DELETE_TOPICS, 6, "request")
        r = await self._forward(ApiKey.DELETE_TOPICS, 6, topics=(entities.make(mod.DeleteTopicState, name=name,
                                                                                     topic_id=None),), timeout=30000)
        if int(r.responses[0].error_code):
            raise KafkaProtocolError(ErrorCode(int(r.responses[0].error_code)), r.responses[0].error_message)
        await self._until(lambda: name not in self.topics)

    async def alter_topic_config(self, name: str, set_: dict[str, str], delete: list[str]) -> None:
        mod = entities.module(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request")
        configs = tuple([entities.make(mod.AlterableConfig, name=k, config_operation=0, value=str(v))
                         for k, v in set_.items()] +
                        [entities.make(mod.AlterableConfig, name=k, config_operation=1, value=None) for k in delete])
        r = await self._forward(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, resources=(entities.make(
            mod.AlterConfigsResource, resource_type=2, resource_name=name, configs=configs),), validate_only=False)
        res = r.responses[0]
        if int(res.error_code):
            raise KafkaProtocolError(ErrorCode(int(res.error_code)), res.error_message)
        expected = {**self.topics[name].overrides, **{k: str(v) for k, v in set_.items()}}
        for k in delete:
            expected.pop(k, None)
        await self._until(lambda: name in self.topics and self.topics[name].overrides == expected)
