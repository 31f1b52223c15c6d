"""Which broker coordinates a group: the leader of the group's `__consumer_offsets` partition, under
that partition's lease (docs/cluster.md, "Ownership is a fenced lease, never a view").

As in Kafka, groups follow the leadership of `__consumer_offsets-N`, N = `abs(java_string_hash(group))
% offsets.topic.num.partitions`: an internal topic created through the controller on the first
group lookup, whose partitions get leaders and leader epochs like any topic's but no log (the
groups' files of `storage.group_offsets` are their storage). A broker coordinates the groups of N
while the controller's view names it N's leader at epoch E *and* it holds N's lease at E: it
raises N's token when it first needs it (or when the view shows it), so that a broker deposed
while it was paused writes nothing of N's any more; and whenever the view names another leader,
or the token moved past E (read before every answer, a memory load), it drops N: the groups of N
in memory are forgotten (`unload`) and their requests answered NOT_COORDINATOR.

A single node coordinates every group; nothing here applies to it.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from oncelog.broker.logs.internal_topic import ensure_internal_topic
from oncelog.core.topic_names import CONSUMER_OFFSETS_TOPIC
from oncelog.protocol.errors import ErrorCode
from oncelog.storage.fence import Busy, Fenced
from oncelog.storage.group_offsets import GroupOffsetStore

log = logging.getLogger(__name__)


class GroupOwnership:
    def __init__(self, broker, store: GroupOffsetStore) -> None:
        self.broker, self.store = broker, store
        self.clustered = bool(broker.config["oncelog.cluster"])
        self.num_partitions = broker.config["offsets.topic.num.partitions"]
        # forget the groups of a partition held in memory (the group coordinators' `unload_partition`)
        self.unload: Callable[[int], None] = lambda partition: None
        self._create_lock = asyncio.Lock()

    # ------------------------------------------------------------------ lookups
    def partition_of(self, group: str) -> int:
        return self.store.partition_of(group)

    def coordinator(self, group: str) -> tuple[int, str, int] | None:
        """(node id, host, port) of the group's coordinator as this broker's view says; None while
        its partition has no leader (or `__consumer_offsets` does not exist yet)."""
        b = self.broker
        if not self.clustered:
            return b.node_id, b.advertised_host, b.advertised_port
        leader, _epoch = b.logs.leader(CONSUMER_OFFSETS_TOPIC, self.partition_of(group))
        if CONSUMER_OFFSETS_TOPIC not in b.logs.topics or leader < 0:
            return None
        if leader == b.node_id:
            return b.node_id, b.advertised_host, b.advertised_port
        for entry in b.logs.brokers:
            if entry.node_id == leader:
                return entry.node_id, entry.host, entry.port
        return None

    def coordinates(self, group: str) -> bool:
        return not self.clustered or self.owns_partition(self.partition_of(group))

    def owns_partition(self, partition: int) -> bool:
        """This broker leads `partition` in its view and holds its lease at that epoch (taken now
        if it was not yet); a lease lost or superseded is dropped on the way."""
        if not self.clustered:
            return True
        logs = self.broker.logs
        leader, epoch = logs.leader(CONSUMER_OFFSETS_TOPIC, partition)
        held = dict(self.store.owned()).get(partition)
        if leader != self.broker.node_id or CONSUMER_OFFSETS_TOPIC not in logs.topics:
            if held is not None:
                self._lose(partition, f"broker {leader} leads it now")
            return False
        if held == epoch and self.store.owns(partition):
            return True
        if held is not None:
            self._lose(partition, "its token moved past our epoch" if held == epoch else f"epoch {epoch} is newer")
        try:
            self.store.take(partition, epoch)
        except Busy:
            return False   # a process is inside one write of it (a paused old owner): the next look
        except Fenced as e:
            log.warning("%s-%d: not taken: %s (this view is older)", CONSUMER_OFFSETS_TOPIC, partition, e)
            return False
        log.info("coordinating the groups of %s-%d at epoch %d", CONSUMER_OFFSETS_TOPIC, partition, epoch)
        return True

    def _lose(self, partition: int, why: str) -> None:
        self.store.release(partition)
        self.unload(partition)
        log.info("no longer coordinating the groups of %s-%d: %s", CONSUMER_OFFSETS_TOPIC, partition, why)

    def reconcile(self) -> None:
        """After each view: take the partitions it names this broker's leader of (raising their
        tokens promptly fences a paused old owner), drop the others."""
        if not self.clustered:
            return
        info = self.broker.logs.topics.get(CONSUMER_OFFSETS_TOPIC)
        if info is not None and info.partitions != self.store.offsets_partitions:
            # the topic's count wins over the setting (Kafka never changes it either)
            log.error("%s has %d partitions, offsets.topic.num.partitions says %d: the topic's count is used",
                      CONSUMER_OFFSETS_TOPIC, info.partitions, self.store.offsets_partitions)
            for partition, _epoch in self.store.owned():
                self._lose(partition, "the partition count changed")
            self.store.offsets_partitions = self.num_partitions = info.partitions
        for partition, _epoch in self.store.owned():
            self.owns_partition(partition)
        if info is not None:
            for partition in range(info.partitions):
                if self.broker.logs.leader(CONSUMER_OFFSETS_TOPIC, partition)[0] == self.broker.node_id:
                    self.owns_partition(partition)

    # ------------------------------------------------------------------ the topic
    async def ensure_topic(self) -> int:
        """Create `__consumer_offsets` on first need (a cluster); NONE, or the code to answer meanwhile."""
        if not self.clustered or CONSUMER_OFFSETS_TOPIC in self.broker.logs.topics:
            return ErrorCode.NONE
        code = await ensure_internal_topic(self.broker.logs, self._create_lock, CONSUMER_OFFSETS_TOPIC,
                                           self.num_partitions, {"cleanup.policy": "compact"}, self.broker.now_ms())
        if code == ErrorCode.NONE:
            self.reconcile()
        return code

    def close(self) -> None:
        self.store.close()
