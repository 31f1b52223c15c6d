"""The record batch format, its one header type, and the one walk over a buffer of batches.

Record batch v2 (KIP-98), big-endian:
    baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 | crc u32 |
    attributes i16 | lastOffsetDelta i32 | baseTimestamp i64 | maxTimestamp i64 |
    producerId i64 | producerEpoch i16 | baseSequence i32 | recordsCount i32 | records...
The CRC-32C covers attributes..end, so the broker sets baseOffset and the leader epoch without
recomputing it.

A v0/v1 message (legacy.py) begins with the same offset and length fields and keeps its magic at
the same position, so `iter_batches` frames every format; it describes a v0/v1 message with the
same `BatchHeader`, as Kafka's `RecordBatch` describes both.
"""
from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

from crc32c import crc32c

from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.primitives import Buf

# What the header rewrites patch in place: a bytearray, or a view of memory that is not read-only.
WritableBuf = bytearray | memoryview

BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_OVERHEAD = BATCH_HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the part of a batch not counted in batchLength
MAGIC_POS = 16
CRC_POS = 17
CRC_START = 21  # attributes begin after baseOffset, batchLength, epoch, magic, crc
_EPOCH_POS = 12
_PRODUCER_FIELDS_POS = 43
_MIN_BATCH_LENGTH = BATCH_OVERHEAD - LOG_OVERHEAD

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20

NO_PRODUCER_ID = -1
NO_PARTITION_LEADER_EPOCH = -1

_CRC = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_PRODUCER_FIELDS = struct.Struct(">qhi")  # producerId, producerEpoch, baseSequence
_APPEND_TIME_FIELDS = struct.Struct(">hiqq")  # attributes, lastOffsetDelta, base/maxTimestamp
# v0/v1: offset i64 | size i32 | crc u32 | magic i8 | attributes i8 | [timestamp i64, v1] |
#        key bytes | value bytes  (size counts crc..value; the CRC-32 covers magic..value)
_LEGACY_HEAD = struct.Struct(">qiIbb")
LEGACY_TIMESTAMP_POS = 18
LEGACY_MIN_SIZE = (14, 22)  # crc..value with a null key and value, by magic


class BatchHeader(NamedTuple):
    """A v2 batch header as stored; for a v0/v1 message (magic 0 or 1) the fields it has, one
    record, no producer, and its own offset as base and last (a compressed v1 wrapper's offset is
    its last inner record's; the first needs decompression, see legacy.py)."""
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return 1 if self.attributes & ATTR_TIMESTAMP_TYPE else 0

    @property
    def size(self) -> int:
        return LOG_OVERHEAD + self.batch_length

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0


Header = tuple[str, bytes | None]


class Record(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp_type: int = 0  # 0 CreateTime, 1 LogAppendTime


def corrupt(message: str) -> KafkaProtocolError:
    return KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, message)


def invalid(message: str) -> KafkaProtocolError:
    return KafkaProtocolError(ErrorCode.INVALID_RECORD, message)


def magic_of(buf: Buf, pos: int = 0) -> int:
    """The magic byte of the batch or legacy message at `pos` (same position in all formats)."""
    if len(buf) < pos + MAGIC_POS + 1:
        raise corrupt("record set too short to hold a batch header")
    return buf[pos + MAGIC_POS]


def read_batch_header(buf: Buf, pos: int = 0) -> BatchHeader:
    """Parse the v2 header at `pos` without checking anything but its presence."""
    if len(buf) - pos < BATCH_OVERHEAD:
        raise corrupt(f"record batch header needs {BATCH_OVERHEAD} bytes, {len(buf) - pos} left")
    return BatchHeader._make(BATCH_HEADER.unpack_from(buf, pos))


def iter_batches(buf: Buf, *, strict: bool = False, exact: bool = False) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each complete batch of `buf`, v2 batches and v0/v1 messages alike
    (tell them apart by `header.magic`). Nothing is checked beyond what framing needs; the CRC is
    `check_crc`'s, the rest validate.py's and legacy.py's.

    What ends the walk depends on where the bytes come from:
    - by default (data in the log; a produce request before validation) anything that cannot be
      framed ends it silently: a torn write, which recovery truncates there;
    - `strict` (a Fetch response): an incomplete tail is normal (the broker cuts at max bytes),
      but an entry that is complete by its length and still impossible raises CORRUPT_MESSAGE,
      since nothing after it can be framed and a consumer must not stop there silently;
    - `exact` (a produced record set): the batches must cover `buf` exactly, else
      CORRUPT_MESSAGE.
    """
    pos, end = 0, len(buf)
    unpack, make = BATCH_HEADER.unpack_from, BatchHeader._make
    while pos < end:
        if end - pos >= BATCH_OVERHEAD and buf[pos + MAGIC_POS] == 2:
            header = make(unpack(buf, pos))
            length = header.batch_length
            if length >= _MIN_BATCH_LENGTH and pos + LOG_OVERHEAD + length <= end:
                yield pos, header
                pos += LOG_OVERHEAD + length
                continue
        odd = _odd_entry(buf, pos, end, strict or exact, exact)
        if odd is None:
            return
        yield pos, odd
        pos += LOG_OVERHEAD + odd.batch_length


# how much of an entry `entry_frame` reads: base offset, length, epoch, magic, CRC, attributes,
# last offset delta (a v0/v1 message needs only its first MAGIC_POS + 1 bytes)
FRAME_PREFIX = 27
_LAST_OFFSET_DELTA_POS = 23


class Frame(NamedTuple):
    """Where an entry ends and which offsets it holds, read from its first FRAME_PREFIX bytes."""
    size: int
    first_offset: int
    last_offset: int


def entry_frame(buf: Buf, pos: int, available: int) -> Frame | None:
    """The frame of the entry at `pos` of `buf` (which need hold only its first FRAME_PREFIX bytes),
    when `available` bytes from `pos` on may hold it; None exactly where `iter_batches` (default
    mode) would end its walk over those `available` bytes. What lets the broker find whole batches
    in a log file without reading them (`storage.log.PartitionLog.read_region`)."""
    have = len(buf) - pos
    if have <= MAGIC_POS or available <= MAGIC_POS:
        return None
    first, length = _OFFSET_AND_LENGTH.unpack_from(buf, pos)
    size = LOG_OVERHEAD + length
    if length < 0 or size > available:
        return None
    magic = buf[pos + MAGIC_POS]
    if magic == 2:
        if length < _MIN_BATCH_LENGTH or have < FRAME_PREFIX:
            return None
        return Frame(size, first, first + _I32.unpack_from(buf, pos + _LAST_OFFSET_DELTA_POS)[0])
    if magic > 2 or length < LEGACY_MIN_SIZE[magic]:
        return None
    return Frame(size, first, first)   # a v0/v1 message: its offset is its first and last, as read


def _odd_entry(buf: Buf, pos: int, end: int, strict: bool, exact: bool) -> BatchHeader | None:
    """The entry at `pos` that is not a whole v2 batch: a v0/v1 message, or None where the walk
    ends (raising instead where the mode says so)."""
    if end - pos <= MAGIC_POS:
        if exact:
            raise corrupt("record set ends inside a batch header")
        return None
    offset, length = _OFFSET_AND_LENGTH.unpack_from(buf, pos)
    if length < 0 or pos + LOG_OVERHEAD + length > end:
        if exact:
            raise corrupt("a batch extends past the end of the record set")
        return None
    magic = buf[pos + MAGIC_POS]
    if magic == 2:
        problem = f"record batch length {length} is below the header size"
    elif magic > 2:
        problem = f"unknown magic byte {magic}"
    elif length < LEGACY_MIN_SIZE[magic]:
        problem = f"message size {length} is below the v{magic} message header"
    else:
        _offset, _size, crc, _magic, attributes = _LEGACY_HEAD.unpack_from(buf, pos)
        ts = _I64.unpack_from(buf, pos + LEGACY_TIMESTAMP_POS)[0] if magic == 1 else -1
        return BatchHeader(offset, length, NO_PARTITION_LEADER_EPOCH, magic, crc, attributes, 0, ts, ts,
                           NO_PRODUCER_ID, -1, -1, 1)
    if strict:
        raise corrupt(problem)
    return None


def check_crc(buf: Buf, pos: int, header: BatchHeader) -> None:
    """CORRUPT_MESSAGE unless the v2 batch at `pos` matches its CRC-32C."""
    if crc32c(memoryview(buf)[pos + CRC_START:pos + LOG_OVERHEAD + header.batch_length]) != header.crc:
        raise corrupt(f"record batch CRC-32C mismatch in the batch at offset {header.base_offset}")


def store_crc(buf: WritableBuf, pos: int, end: int) -> None:
    """Compute and write the CRC-32C of the v2 batch at buf[pos:end]."""
    _CRC.pack_into(buf, pos + CRC_POS, crc32c(memoryview(buf)[pos + CRC_START:end]))


# ---------------------------------------------------------------- header rewrites


def writable(buf: Buf) -> WritableBuf:
    """`buf` itself if the header rewrites below can patch it in place (a bytearray, or a
    writable view such as a request frame the broker read into its own buffer), else a copy."""
    if isinstance(buf, bytearray) or (isinstance(buf, memoryview) and not buf.readonly):
        return buf
    return bytearray(buf)


def patch_batch(buf: WritableBuf, pos: int, base_offset: int, partition_leader_epoch: int) -> None:
    """Set the two fields the CRC does not cover, in place."""
    _I64.pack_into(buf, pos, base_offset)
    _I32.pack_into(buf, pos + _EPOCH_POS, partition_leader_epoch)


def set_max_timestamp(buf: WritableBuf, pos: int, header: BatchHeader, timestamp: int) -> None:
    """Rewrite the timestamp type to LogAppendTime with `timestamp`, recomputing the CRC.

    Needed only for topics with message.timestamp.type=LogAppendTime.
    """
    _APPEND_TIME_FIELDS.pack_into(buf, pos + CRC_START, header.attributes | ATTR_TIMESTAMP_TYPE,
                                  header.last_offset_delta, header.base_timestamp, timestamp)
    store_crc(buf, pos, pos + header.size)


def rewrite_producer_state(batch: bytes | bytearray, producer_id: int, producer_epoch: int,
                           base_sequence: int) -> bytes:
    """The same single batch under another producer id/epoch/sequence (epoch bump, fallback to
    plain producing); recomputes the CRC, leaves the records untouched."""
    buf = bytearray(batch)
    _PRODUCER_FIELDS.pack_into(buf, _PRODUCER_FIELDS_POS, producer_id, producer_epoch, base_sequence)
    store_crc(buf, 0, len(buf))
    return bytes(buf)
