"""Transactional offsets on a `__consumer_offsets` partition, sans-IO.

Kafka writes a TxnOffsetCommit to the group's offsets partition as a transactional batch of the
producer, and the transaction's marker to that partition through the partition's producer state,
the same as on a data partition: a marker of an older producer epoch is INVALID_PRODUCER_EPOCH,
of an older coordinator epoch TRANSACTION_COORDINATOR_FENCED, and only a marker the partition took
settles the producer's pending offsets there (COMMIT makes them the groups' committed offsets,
ABORT drops them; `OffsetMetadataManager.replayEndTransactionMarker`). Without those checks a late
ABORT of a finished transaction drops the offsets of the producer's next one (its input is read
again) and a late COMMIT commits offsets of a transaction that then aborts (its input is skipped).

`OffsetsProducer` is what one offsets partition keeps of one producer: its epoch, the coordinator
epoch of its last marker, when it was last active (for `producer.id.expiration.ms`), and the
offsets its open transaction committed, per group. Values are immutable; each step returns the
next one (storage persists it before anything is answered).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from oncelog.core.producer_epoch import marker_error
from oncelog.protocol.errors import ErrorCode

Offsets = Mapping[tuple[str, int], Any]  # (topic, partition) -> the storage's committed-offset value


@dataclass(frozen=True)
class OffsetsProducer:
    epoch: int = -1                  # -1: not known (pending offsets stored before epochs were)
    coordinator_epoch: int = -1
    updated_ms: int = -1
    pending: Mapping[str, Offsets] = field(default_factory=dict)  # group -> offsets


def add_offsets(current: OffsetsProducer | None, epoch: int, group: str, offsets: Offsets,
                now_ms: int) -> tuple[int, str | None, OffsetsProducer | None]:
    """A TxnOffsetCommit's offsets join the producer's open transaction here: (code, message, the
    entry after it; None when refused). An older epoch than the partition knows is fenced, as a
    transactional batch of that epoch is on a data partition."""
    p = current or OffsetsProducer()
    if epoch < p.epoch:
        return (ErrorCode.INVALID_PRODUCER_EPOCH,
                f"offsets of epoch {epoch}: the producer is at epoch {p.epoch} on this partition", None)
    pending = dict(p.pending)
    pending[group] = {**pending.get(group, {}), **offsets}
    return ErrorCode.NONE, None, replace(p, epoch=epoch, updated_ms=max(p.updated_ms, now_ms), pending=pending)


def take_marker(current: OffsetsProducer | None, producer_id: int, epoch: int, coordinator_epoch: int,
                now_ms: int, transaction_version: int = 0
                ) -> tuple[int, str | None, OffsetsProducer | None, Mapping[str, Offsets]]:
    """A COMMIT/ABORT marker for the producer on this partition: (code, message, the entry after
    it, the pending offsets it settles per group). Refused: the entry unchanged and nothing settled.
    Taken: the producer takes the marker's epoch and coordinator epoch (when higher) and has no
    open transaction here; a marker for a producer with nothing pending settles nothing (a
    repeated marker, or a transaction that wrote no offsets here). The producer's transaction is
    open here while it has offsets pending: a Transactions V2 marker at its epoch is then a late
    one of the transaction before (KIP-1228, `producer_epoch.marker_error`)."""
    p = current or OffsetsProducer()
    code, message = marker_error(producer_id, p.epoch, p.coordinator_epoch, epoch, coordinator_epoch,
                                 transaction_version, bool(p.pending))
    if code:
        return code, message, current, {}
    after = OffsetsProducer(max(p.epoch, epoch), max(p.coordinator_epoch, coordinator_epoch),
                            max(p.updated_ms, now_ms))
    return ErrorCode.NONE, None, after, p.pending


def expired(p: OffsetsProducer, now_ms: int, expiration_ms: int) -> bool:
    """Forgotten after `producer.id.expiration.ms` idle, never with a transaction open."""
    return not p.pending and now_ms - p.updated_ms >= expiration_ms
