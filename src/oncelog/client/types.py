"""Public value types of the client API."""
from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int
    offset: int | None = None   # assign(): where to start; None = auto.offset.reset

    @property
    def key(self) -> "TopicPartition":
        return TopicPartition(self.topic, self.partition)


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int          # 0 CreateTime, 1 LogAppendTime
    key: bytes | None
    value: bytes | None
    headers: tuple = ()


EARLIEST = -2   # ListOffsets timestamps
LATEST = -1
