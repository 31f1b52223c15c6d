"""Public value types of the client API."""
from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    """A partition of a topic, the one type for it across the client. `offset` goes with it only
    where an offset belongs (Consumer.assign: where to start; None = auto.offset.reset); the
    producer's partitions leave it None, so that equal partitions compare and hash equal."""
    topic: str
    partition: int
    offset: int | None = None

    @property
    def key(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class RecordMetadata(NamedTuple):
    """Where a record sent with `send`/`produce` landed."""
    topic: str
    partition: int
    offset: int | None   # None after DUPLICATE_SEQUENCE_NUMBER: delivered, offset unknown
    timestamp: int


class SentBatch(NamedTuple):
    """The result of `send_encoded`: where a caller-encoded batch landed."""
    topic: str
    partition: int
    base_offset: int | None   # None after DUPLICATE_SEQUENCE_NUMBER
    count: int  # type: ignore[assignment]  # shadows tuple.count, as the Java client's field is named
    timestamp: int            # the batch's max timestamp, or the broker's LogAppendTime


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


class OffsetAndMetadata(NamedTuple):
    """A consumer position committed with `send_offsets_to_transaction` (Kafka's name)."""
    offset: int
    metadata: str = ""
    leader_epoch: int = -1


class ConsumerGroupMetadata(NamedTuple):
    """What `Consumer.group_metadata()` returns, for TxnOffsetCommit v3 (KIP-447): the group
    coordinator fences a zombie whose generation, member id or instance id is stale. A consumer
    outside any group leaves the defaults (Kafka's: generation -1, member "", no instance id)."""
    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None
