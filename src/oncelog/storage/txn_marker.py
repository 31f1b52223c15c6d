"""A COMMIT/ABORT control batch appended to a partition: the coordinator side's stand-in for the
partition side's marker API (branch i16-partition replaces it with one that checks epochs,
closes the producer's open transaction, moves the LSO and writes the aborted-transaction index).

Until then a marker is just appended: the producer state neither checks nor records it (replay
skips control batches), which is all the coordinator needs to prove its markers reach the log.
"""
from __future__ import annotations

from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.primitives import I16 as _I16
from oncelog.protocol.primitives import I32
from oncelog.protocol.records.batch import ATTR_CONTROL, ATTR_TRANSACTIONAL
from oncelog.protocol.records.encode import HEADER_ROOM, encode_record, seal_batch
from oncelog.storage.partition import Partition

ABORT_TYPE, COMMIT_TYPE = 0, 1  # Kafka's ControlRecordType


def control_batch(producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                  now_ms: int) -> bytearray:
    """Kafka's EndTransactionMarker: key (version 0, type), value (version 0, coordinator epoch)."""
    key = _I16.pack(0) + _I16.pack(COMMIT_TYPE if commit else ABORT_TYPE)
    value = _I16.pack(0) + I32.pack(coordinator_epoch)
    buf = bytearray(HEADER_ROOM) + encode_record(0, 0, key, value)
    return seal_batch(buf, 1, base_timestamp=now_ms, attributes=ATTR_TRANSACTIONAL | ATTR_CONTROL,
                      producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=-1)


def append_marker(partition: Partition, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                  commit: bool, now_ms: int) -> ErrorCode:
    """Appended (not yet fsynced: the caller waits for the group commit) or the error."""
    if partition.offline:
        return ErrorCode.KAFKA_STORAGE_ERROR
    if partition.message_format_magic < 2:
        return ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT
    try:
        partition.log.append(control_batch(producer_id, producer_epoch, coordinator_epoch, commit, now_ms),
                             now_ms)
    except KafkaProtocolError as e:
        return ErrorCode(e.code)
    except OSError:
        return ErrorCode.KAFKA_STORAGE_ERROR
    return ErrorCode.NONE
