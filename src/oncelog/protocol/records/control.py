"""Control batches: the COMMIT/ABORT markers that end a transaction in a partition (KIP-98).

A control batch has the transactional and control attribute bits, the transaction's producer id
and epoch, base sequence -1 and exactly one record (Kafka's `MemoryRecords.withEndTransactionMarker`):
    key   = version i16 (0) | type i16 (0 ABORT, 1 COMMIT)      (ControlRecordType)
    value = version i16 (0) | coordinator epoch i32            (EndTransactionMarker)
Readers accept higher key/value versions as long as the fields they know are there, as Kafka does.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from oncelog.protocol.primitives import Buf
from oncelog.protocol.records.batch import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    BATCH_OVERHEAD,
    BatchHeader,
    corrupt,
    iter_batches,
)
from oncelog.protocol.records.decode import decode_batch
from oncelog.protocol.records.encode import HEADER_ROOM, encode_record, seal_batch
from oncelog.protocol.records.varint import decode_varint

ABORT = 0
COMMIT = 1
CONTROL_KEY = struct.Struct(">hh")       # version, type
MARKER_VALUE = struct.Struct(">hi")      # version, coordinator epoch
CONTROL_ATTRIBUTES = ATTR_TRANSACTIONAL | ATTR_CONTROL


class EndTxnMarker(NamedTuple):
    commit: bool
    coordinator_epoch: int


def encode_marker_batch(producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                        timestamp: int, *, base_offset: int = 0, partition_leader_epoch: int = -1) -> bytearray:
    """One control batch holding one COMMIT or ABORT record."""
    key = CONTROL_KEY.pack(0, COMMIT if commit else ABORT)
    value = MARKER_VALUE.pack(0, coordinator_epoch)
    record = encode_record(0, 0, key, value)
    return seal_batch(bytearray().join((HEADER_ROOM, record)), 1, base_offset=base_offset,
                      base_timestamp=timestamp, max_timestamp=timestamp, attributes=CONTROL_ATTRIBUTES,
                      producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=-1,
                      partition_leader_epoch=partition_leader_epoch)


def control_type(key: Buf | None) -> int:
    """ABORT or COMMIT from a control record's key; other types (Kafka has more, e.g. leader
    change records) come back as they are."""
    if key is None or len(key) < CONTROL_KEY.size:
        raise corrupt("control record key shorter than version + type")
    version, kind = CONTROL_KEY.unpack_from(key)
    if version < 0:
        raise corrupt(f"control record key version {version}")
    return int(kind)


def decode_marker(key: Buf | None, value: Buf | None) -> EndTxnMarker:
    kind = control_type(key)
    if kind not in (ABORT, COMMIT):
        raise corrupt(f"control record type {kind} is not a transaction marker")
    if value is None or len(value) < MARKER_VALUE.size:
        raise corrupt("end-transaction marker value shorter than version + coordinator epoch")
    version, coordinator_epoch = MARKER_VALUE.unpack_from(value)
    if version < 0:
        raise corrupt(f"end-transaction marker version {version}")
    return EndTxnMarker(kind == COMMIT, coordinator_epoch)


def marker_of_batch(buf: Buf) -> EndTxnMarker:
    """The marker of the control batch at the start of `buf` (CRC checked)."""
    for _pos, header in iter_batches(buf):
        if not header.is_control:
            raise corrupt("not a control batch")
        records = decode_batch(buf)
        if len(records) != 1:
            raise corrupt(f"a control batch holds {len(records)} records")
        return decode_marker(records[0].key, records[0].value)
    raise corrupt("no complete batch in buffer")


def is_abort_marker_batch(buf: Buf, pos: int, header: BatchHeader) -> bool:
    """Whether the control batch at `pos` is an ABORT, read from its first record's key without
    decoding the batch (a consumer's batch-level filter needs only this)."""
    mv = memoryview(buf)
    if header.compression:  # Kafka never compresses markers; another writer might
        return not marker_of_batch(mv[pos:pos + header.size]).commit
    # a record: length, attributes i8, timestamp delta, offset delta, key length (varints), key
    start = pos + BATCH_OVERHEAD
    p = decode_varint(mv, start)[1] + 1
    p = decode_varint(mv, p)[1]
    p = decode_varint(mv, p)[1]
    klen, p = decode_varint(mv, p)
    if klen < CONTROL_KEY.size or p + klen > pos + header.size:
        raise corrupt("control record key shorter than version + type")
    return bool(CONTROL_KEY.unpack_from(mv, p)[1] == ABORT)
