"""storage.topic_registry: the one topic registry of LogManager and ClusterLogs — names and ids,
effective configs, open partitions following a change at once, the periodic work on them."""
from __future__ import annotations

import uuid
from collections.abc import Iterator

from oncelog.storage.partition import Partition, PartitionConfig
from oncelog.storage.topic_registry import TopicInfo, TopicRegistry, partition_dir

NOW = 1_700_000_000_000


class Hosting(TopicRegistry):
    """A registry whose open partitions are a list: what a subclass supplies."""

    def __init__(self, directory, **kwargs) -> None:
        super().__init__({"retention.ms": 1000}, **kwargs)
        self.directory = directory
        self.open: list[Partition] = []

    def partitions(self) -> Iterator[Partition]:
        return iter(self.open)

    def host(self, info: TopicInfo, index: int) -> Partition:
        p = Partition.open(info.name, index, partition_dir(self.directory, info.name, index),
                           self._partition_config(info.name), NOW)
        self.open.append(p)
        return p


def test_names_ids_and_configs(tmp_path):
    r = Hosting(tmp_path)
    a, b = TopicInfo("a", uuid.uuid4(), 1, {"retention.ms": "5"}), TopicInfo("b", uuid.uuid4(), 1)
    r._set_topics({"a": a, "b": b})
    assert r.topic_name(a.topic_id) == "a" and r.topic_name(None) is None
    assert r.topic_config("a")["retention.ms"] == 5 and r.topic_config("b")["retention.ms"] == 1000
    assert r._remove_topic("a") is a and r.topic_name(a.topic_id) is None
    r._add_topic(a)
    assert set(r.topics) == {"a", "b"}


def test_open_partitions_follow_a_changed_default_or_override_at_once(tmp_path):
    r = Hosting(tmp_path)
    a, b = TopicInfo("a", uuid.uuid4(), 1, {"retention.ms": "5"}), TopicInfo("b", uuid.uuid4(), 1)
    r._set_topics({"a": a, "b": b})
    pa, pb = r.host(a, 0), r.host(b, 0)
    r.set_server_defaults({"retention.ms": 2000})
    assert (pa.log.config.retention_ms, pb.log.config.retention_ms) == (5, 2000)
    a.overrides = {}
    r._apply_config("a")
    assert pa.log.config.retention_ms == 2000
    assert isinstance(r._partition_config("a"), PartitionConfig)
    r.tick(NOW)  # the periodic work runs over the open partitions
    for p in (pa, pb):
        p.close()
    r.cleaner.close()
