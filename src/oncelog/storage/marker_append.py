"""Writing a transaction marker into a local partition, durably: the one path behind
`Logs.write_txn_marker` (the coordinator's marker writer calls it directly; the WriteTxnMarkers
handler calls it for markers that come over the wire).

A marker is acknowledged only once fsynced, whatever `write.caching` says (the coordinator writes
Complete* after every acknowledgement, and a lost marker would leave a transaction open for
ever): the same group commit that answers acks=all Produce requests, or, when none is wired (a
LogManager used on its own), an fsync here.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

if TYPE_CHECKING:
    from oncelog.storage.partition import Partition

# (partition, offset) -> None when everything below `offset` is durable, else a future resolving
# to True once it is, False if a failed fsync cut it (broker.logs.fsync_batcher.GroupCommit.durable)
Durability = Callable[[object, int], "Awaitable[bool] | None"]


class MarkerWriting:
    """What both Logs implementations add for markers; they set `durable` and `clock_ms`."""

    durable: Durability | None = None
    clock_ms: Callable[[], int] = staticmethod(lambda: int(time.time() * 1000))

    async def write_txn_marker(self, topic: str, partition: int, producer_id: int, producer_epoch: int,
                               coordinator_epoch: int, commit: bool, transaction_version: int = 0) -> ErrorCode:
        """NONE once the marker is fsynced; otherwise why not: NOT_LEADER_OR_FOLLOWER /
        UNKNOWN_TOPIC_OR_PARTITION (retry at the leader), INVALID_PRODUCER_EPOCH,
        TRANSACTION_COORDINATOR_FENCED (stop), UNSUPPORTED_FOR_MESSAGE_FORMAT (done),
        KAFKA_STORAGE_ERROR (retry). `transaction_version`: the marker's (KIP-1228)."""
        p = self.get_partition(topic, partition)  # type: ignore[attr-defined]
        if p is None:
            code: ErrorCode = self.partition_error(topic, partition)  # type: ignore[attr-defined]
            return code
        return await write_marker(p, producer_id, producer_epoch, coordinator_epoch, commit,
                                  self.clock_ms(), self.durable, transaction_version)


async def write_marker(partition: Partition, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                       commit: bool, now_ms: int, durable: Durability | None,
                       transaction_version: int = 0) -> ErrorCode:
    try:
        offset = partition.append_marker(producer_id, producer_epoch, coordinator_epoch, commit, now_ms,
                                         transaction_version)
    except KafkaProtocolError as exc:
        return ErrorCode(exc.code)
    if durable is None:
        try:
            partition.log.flush(now_ms)
        except KafkaProtocolError as exc:
            return ErrorCode(exc.code)
        return ErrorCode.NONE
    waiting = durable(partition, offset + 1)
    if waiting is not None and not await waiting:
        return ErrorCode.KAFKA_STORAGE_ERROR
    return ErrorCode.NONE
