"""Partition leadership on one machine: which broker leads each partition, at which leader epoch.

Pure decisions in the controller's decide/replay style: every `decide_*` returns the records to
append (and changes nothing); `replay(record)` is the only state change, so the state after a
restart is the state rebuilt from the metadata log. A leader epoch only ever increases, which is
what fences an old leader.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from oncelog.core.topic_names import validate_topic_name
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

TOPIC, DELETE_TOPIC, TOPIC_CONFIG, LEADER = "topic", "delete_topic", "topic_config", "leader"
PARTITIONS = "partitions"  # a topic's partition count grew (CreatePartitions)
NO_LEADER = -1


def check_partition_increase(name: str, current: int, count: int, assignments: list[list[int]] | None,
                             brokers: set[int]) -> list[int] | None:
    """CreatePartitions' rules (Kafka's ReplicationControlManager.createPartitions): `count` must
    exceed `current`; an explicit assignment names one broker list per new partition, each with
    exactly one known broker (one replica per partition here). Returns the assigned leaders, or
    None when the cluster is to place them."""
    if count == current:
        raise KafkaProtocolError(ErrorCode.INVALID_PARTITIONS, f"Topic already has {current} partition(s).")
    if count < current:
        raise KafkaProtocolError(ErrorCode.INVALID_PARTITIONS, f"The topic {name} currently has {current} "
                                 f"partition(s); {count} would not be an increase.")
    if assignments is None:
        return None
    additional = count - current
    if len(assignments) != additional:
        raise KafkaProtocolError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"Attempted to add {additional} "
                                 f"additional partition(s), but only {len(assignments)} assignment(s) were "
                                 "specified.")
    leaders = []
    for replicas in assignments:
        if not replicas:
            raise KafkaProtocolError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                     "The manual partition assignment includes an empty replica list.")
        if len(replicas) != 1:
            raise KafkaProtocolError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment "
                                     f"includes a partition with {len(replicas)} replica(s), but this is not "
                                     "consistent with previous partitions, which have 1 replica(s).")
        if replicas[0] not in brokers:
            raise KafkaProtocolError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment "
                                     f"includes broker {replicas[0]}, but no such broker is registered.")
        leaders.append(replicas[0])
    return leaders


@dataclass
class TopicRecord:
    name: str
    topic_id: str
    partitions: int
    overrides: dict[str, str] = field(default_factory=dict)


@dataclass
class Leadership:
    topics: dict[str, TopicRecord] = field(default_factory=dict)
    leaders: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)  # -> (leader, epoch)

    # ------------------------------------------------------------------ decisions
    def decide_create_topic(self, name: str, topic_id: str, partitions: int,
                            overrides: dict[str, str], live: list[int]) -> list[dict[str, Any]]:
        validate_topic_name(name)   # brokers make directories from what is recorded here
        if name in self.topics:
            raise KafkaProtocolError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        records: list[dict[str, Any]] = [{"type": TOPIC, "name": name, "topic_id": topic_id,
                                          "partitions": partitions, "overrides": dict(overrides)}]
        for p in range(partitions):
            leader = self._least_loaded(live, extra=records) if live else NO_LEADER
            records.append({"type": LEADER, "topic": name, "partition": p, "leader": leader, "epoch": 0})
        return records

    def decide_delete_topic(self, name: str) -> list[dict[str, Any]]:
        if name not in self.topics:
            raise KafkaProtocolError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
        return [{"type": DELETE_TOPIC, "name": name}]

    def decide_create_partitions(self, name: str, count: int, assignments: list[list[int]] | None,
                                 live: list[int]) -> list[dict[str, Any]]:
        topic = self.topics.get(name)
        if topic is None:
            raise KafkaProtocolError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
        leaders = check_partition_increase(name, topic.partitions, count, assignments, set(live))
        records: list[dict[str, Any]] = [{"type": PARTITIONS, "name": name, "partitions": count}]
        for i, p in enumerate(range(topic.partitions, count)):
            if leaders is not None:
                leader = leaders[i]
            else:
                leader = self._least_loaded(live, extra=records) if live else NO_LEADER
            records.append({"type": LEADER, "topic": name, "partition": p, "leader": leader, "epoch": 0})
        return records

    def decide_topic_config(self, name: str, overrides: dict[str, str]) -> list[dict[str, Any]]:
        if name not in self.topics:
            raise KafkaProtocolError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
        return [{"type": TOPIC_CONFIG, "name": name, "overrides": dict(overrides)}]

    def decide_move(self, topic: str, partition: int, broker: int, live: list[int]) -> list[dict[str, Any]]:
        key = (topic, partition)
        if key not in self.leaders:
            raise KafkaProtocolError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {topic}-{partition}")
        if broker not in live:
            raise KafkaProtocolError(ErrorCode.BROKER_NOT_AVAILABLE, f"broker {broker} is not alive")
        leader, epoch = self.leaders[key]
        if leader == broker:
            return []
        return [{"type": LEADER, "topic": topic, "partition": partition, "leader": broker, "epoch": epoch + 1}]

    def decide_brokers_changed(self, live: list[int]) -> list[dict[str, Any]]:
        """Partitions whose leader is not alive get a live one (or none), with a new epoch."""
        records: list[dict[str, Any]] = []
        for (topic, p), (leader, epoch) in sorted(self.leaders.items()):
            if leader in live or (leader == NO_LEADER and not live):
                continue
            new = self._least_loaded(live, extra=records) if live else NO_LEADER
            records.append({"type": LEADER, "topic": topic, "partition": p, "leader": new, "epoch": epoch + 1})
        return records

    def _least_loaded(self, live: list[int], extra: list[dict[str, Any]]) -> int:
        load = {b: 0 for b in live}
        pending = {(r["topic"], r["partition"]): r["leader"] for r in extra if r["type"] == LEADER}
        current = {**{k: v[0] for k, v in self.leaders.items()}, **pending}
        for leader in current.values():
            if leader in load:
                load[leader] += 1
        return min(sorted(load), key=lambda b: load[b])

    # ------------------------------------------------------------------ the only state change
    def replay(self, record: dict[str, Any]) -> None:
        kind = record["type"]
        if kind == TOPIC:
            self.topics[record["name"]] = TopicRecord(record["name"], record["topic_id"],
                                                      record["partitions"], dict(record["overrides"]))
        elif kind == DELETE_TOPIC:
            t = self.topics.pop(record["name"], None)
            if t is not None:
                for p in range(t.partitions):
                    self.leaders.pop((t.name, p), None)
        elif kind == PARTITIONS:
            topic = self.topics[record["name"]]
            if record["partitions"] <= topic.partitions:
                raise ValueError(f"partitions of {topic.name} must increase: {topic.partitions} -> "
                                 f"{record['partitions']}")
            topic.partitions = record["partitions"]
        elif kind == TOPIC_CONFIG:
            self.topics[record["name"]].overrides = dict(record["overrides"])
        elif kind == LEADER:
            key = (record["topic"], record["partition"])
            old = self.leaders.get(key)
            if old is not None and record["epoch"] <= old[1]:
                raise ValueError(f"leader epoch of {key} must increase: {old[1]} -> {record['epoch']}")
            self.leaders[key] = (record["leader"], record["epoch"])
        else:
            raise ValueError(f"unknown leadership record {kind!r}")
