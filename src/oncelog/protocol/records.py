"""Record batches at header level: what the broker needs to validate and store produced data.

The broker never decodes individual records on the produce path. A v2 batch is validated by its
61-byte header and one CRC-32C over attributes..end; the broker then patches the two fields the CRC
does not cover (base offset, partition leader epoch) and writes the bytes as they came.

Old message sets (magic 0 and 1, one CRC-32 per message) are read and validated here too, because a
topic may keep an old `message.format.version`; they are never on a hot path.

Record batch v2, big-endian:
    baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 | crc u32 |
    attributes i16 | lastOffsetDelta i32 | baseTimestamp i64 | maxTimestamp i64 |
    producerId i64 | producerEpoch i16 | baseSequence i32 | recordsCount i32 | records...
"""
from __future__ import annotations

import struct
import zlib
from typing import Iterator, NamedTuple

from crc32c import crc32c

from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_OVERHEAD = _HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the part of a batch not counted in batchLength
_CRC_START = 21  # attributes begin after baseOffset, batchLength, epoch, magic, crc
_MAGIC_POS = 16
_OFFSET_AND_EPOCH = struct.Struct(">q")
_EPOCH = struct.Struct(">i")
_EPOCH_POS = 12
_MIN_BATCH_LENGTH = BATCH_OVERHEAD - LOG_OVERHEAD

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20

NO_PRODUCER_ID = -1


class BatchHeader(NamedTuple):
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
    def last_sequence(self) -> int:
        # sequences wrap from 2**31-1 to 0 (core.sequence holds the rest of that arithmetic)
        return (self.base_sequence + self.last_offset_delta) % 2**31

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


def _corrupt(message: str) -> KafkaProtocolError:
    return KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, message)


def _invalid(message: str) -> KafkaProtocolError:
    return KafkaProtocolError(ErrorCode.INVALID_RECORD, message)


def magic_of(buf, pos: int = 0) -> int:
    """The magic byte of the batch or legacy message at `pos` (same position in all formats)."""
    if len(buf) < pos + _MAGIC_POS + 1:
        raise _corrupt("record set too short to hold a batch header")
    return buf[pos + _MAGIC_POS]


def read_batch_header(buf, pos: int = 0) -> BatchHeader:
    """Parse the v2 header at `pos` without checking anything but its presence."""
    if len(buf) - pos < BATCH_OVERHEAD:
        raise _corrupt(f"record batch header needs {BATCH_OVERHEAD} bytes, {len(buf) - pos} left")
    return BatchHeader._make(_HEADER.unpack_from(buf, pos))


def iter_batches(buf) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each complete v2 batch; stops silently before an incomplete tail.

    Used on data already in the log (reads, recovery scans), where a short tail means a torn write
    or a fetch cut at max bytes, not a client error.
    """
    pos, end = 0, len(buf)
    while end - pos >= BATCH_OVERHEAD:
        header = BatchHeader._make(_HEADER.unpack_from(buf, pos))
        size = LOG_OVERHEAD + header.batch_length
        if header.batch_length < _MIN_BATCH_LENGTH or pos + size > end:
            return
        yield pos, header
        pos += size


def check_batch(buf, pos: int, header: BatchHeader) -> None:
    """Check one v2 batch whose header was read at `pos`: length, magic, counts, then the CRC."""
    if header.magic != 2:
        raise _corrupt(f"record batch magic {header.magic}, expected 2")
    if header.batch_length < _MIN_BATCH_LENGTH:
        raise _corrupt(f"record batch length {header.batch_length} is below the header size")
    end = pos + LOG_OVERHEAD + header.batch_length
    if end > len(buf):
        raise _corrupt("record batch extends past the end of the record set")
    if header.records_count <= 0:
        raise _invalid(f"record batch holds {header.records_count} records")
    if header.last_offset_delta != header.records_count - 1:
        raise _invalid(f"record batch count {header.records_count} disagrees with last offset "
                       f"delta {header.last_offset_delta}")
    if header.compression == 0 and header.batch_length - _MIN_BATCH_LENGTH < header.records_count * 7:
        # An uncompressed record is at least 7 bytes (length, attributes, two deltas, key, value, headers).
        raise _invalid(f"record batch of {header.batch_length} bytes cannot hold "
                       f"{header.records_count} records")
    if crc32c(memoryview(buf)[pos + _CRC_START:end]) != header.crc:
        raise _corrupt("record batch CRC-32C mismatch")


def validate_batch(buf, pos: int = 0) -> BatchHeader:
    """Validate the single v2 batch at `pos` and return its header."""
    header = read_batch_header(buf, pos)
    check_batch(buf, pos, header)
    return header


def validate_record_set(buf) -> list[BatchHeader]:
    """Validate a produced v2 record set (one or more batches covering the buffer exactly)."""
    headers: list[BatchHeader] = []
    pos, end = 0, len(buf)
    if end == 0:
        raise _invalid("empty record set")
    while pos < end:
        header = read_batch_header(buf, pos)
        check_batch(buf, pos, header)
        headers.append(header)
        pos += LOG_OVERHEAD + header.batch_length
    return headers


def patch_batch(buf: bytearray, pos: int, base_offset: int, partition_leader_epoch: int) -> None:
    """Set the two fields the CRC does not cover, in place."""
    _OFFSET_AND_EPOCH.pack_into(buf, pos, base_offset)
    _EPOCH.pack_into(buf, pos + _EPOCH_POS, partition_leader_epoch)


def set_max_timestamp(buf: bytearray, pos: int, header: BatchHeader, timestamp: int) -> None:
    """Rewrite the timestamp type to LogAppendTime with `timestamp`, recomputing the CRC.

    Needed only for topics with message.timestamp.type=LogAppendTime.
    """
    attributes = header.attributes | ATTR_TIMESTAMP_TYPE
    struct.pack_into(">hiqq", buf, pos + _CRC_START, attributes, header.last_offset_delta,
                     header.base_timestamp, timestamp)
    end = pos + header.size
    struct.pack_into(">I", buf, pos + 17, crc32c(memoryview(buf)[pos + _CRC_START:end]))


# ------------------------------------------------------------- v0/v1 message sets

_LEGACY_HEAD = struct.Struct(">qiIbb")  # offset, size, crc, magic, attributes
_LEGACY_OFFSET = struct.Struct(">q")
LEGACY_LOG_OVERHEAD = 12
_LEGACY_MIN_SIZE = {0: 14, 1: 22}  # crc..value with null key and value


class LegacyMessage(NamedTuple):
    position: int
    offset: int
    size: int  # bytes after offset+size, as in the message's own size field
    magic: int
    attributes: int
    timestamp: int  # -1 for magic 0

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def total_size(self) -> int:
        return LEGACY_LOG_OVERHEAD + self.size


def iter_legacy_messages(buf) -> Iterator[LegacyMessage]:
    """The complete top-level messages of a v0/v1 message set; stops before an incomplete tail."""
    pos, end = 0, len(buf)
    while end - pos >= _LEGACY_HEAD.size:
        offset, size, _crc, magic, attributes = _LEGACY_HEAD.unpack_from(buf, pos)
        if magic not in (0, 1) or size < _LEGACY_MIN_SIZE[magic] or pos + LEGACY_LOG_OVERHEAD + size > end:
            return
        timestamp = struct.unpack_from(">q", buf, pos + 18)[0] if magic == 1 else -1
        yield LegacyMessage(pos, offset, size, magic, attributes, timestamp)
        pos += LEGACY_LOG_OVERHEAD + size


def _check_legacy_message(buf, pos: int, magic_expected: int | None) -> tuple[int, int, int, int]:
    if len(buf) - pos < _LEGACY_HEAD.size:
        raise _corrupt("message set ends inside a message header")
    offset, size, crc, magic, attributes = _LEGACY_HEAD.unpack_from(buf, pos)
    if magic not in (0, 1):
        raise _corrupt(f"message magic {magic} in a v0/v1 message set")
    if magic_expected is not None and magic != magic_expected:
        raise _invalid("a message set mixes magic 0 and magic 1")
    if size < _LEGACY_MIN_SIZE[magic] or pos + LEGACY_LOG_OVERHEAD + size > len(buf):
        raise _corrupt(f"message size {size} does not fit the message set")
    end = pos + LEGACY_LOG_OVERHEAD + size
    if zlib.crc32(memoryview(buf)[pos + 16:end]) != crc:
        raise _corrupt("message CRC-32 mismatch")
    return offset, size, magic, attributes


def _legacy_value(buf, pos: int, magic: int) -> memoryview:
    """The value bytes of the legacy message at `pos` (its compressed inner set for a wrapper)."""
    p = pos + 18 + (8 if magic == 1 else 0)
    key_len = struct.unpack_from(">i", buf, p)[0]
    p += 4 + max(key_len, 0)
    value_len = struct.unpack_from(">i", buf, p)[0]
    p += 4
    if value_len < 0:
        return memoryview(b"")
    return memoryview(buf)[p:p + value_len]


class LegacySetInfo(NamedTuple):
    magic: int
    message_count: int  # counting the messages inside compressed wrappers
    max_timestamp: int


def validate_legacy_message_set(buf) -> LegacySetInfo:
    """Validate a produced v0/v1 message set: every CRC, sizes, one magic, inner sets of wrappers.

    Compressed magic-0 wrappers are refused: their inner messages carry absolute offsets, which the
    broker would have to recompress to assign; no maintained client sends them.
    """
    from oncelog.protocol.compression import decompress  # only the legacy path needs it

    if len(buf) == 0:
        raise _invalid("empty message set")
    pos, count, magic_seen, max_ts = 0, 0, None, -1
    while pos < len(buf):
        _offset, size, magic, attributes = _check_legacy_message(buf, pos, magic_seen)
        magic_seen = magic
        if magic == 1:
            max_ts = max(max_ts, struct.unpack_from(">q", buf, pos + 18)[0])
        codec = attributes & ATTR_COMPRESSION_MASK
        if codec:
            if magic == 0:
                raise _invalid("compressed magic-0 message sets are not supported; use magic 1 or 2")
            try:
                inner = decompress(codec, bytes(_legacy_value(buf, pos, magic)))
            except Exception as exc:  # a codec error is a corrupt message, whatever the library
                raise _corrupt(f"compressed message set does not decompress: {exc}") from None
            inner_pos, inner_count = 0, 0
            while inner_pos < len(inner):
                inner_offset, inner_size, _m, inner_attrs = _check_legacy_message(inner, inner_pos, 1)
                if inner_attrs & ATTR_COMPRESSION_MASK:
                    raise _invalid("nested compressed message")
                if inner_offset != inner_count:
                    raise _invalid("inner offsets of a compressed message set must be 0, 1, 2, ...")
                inner_count += 1
                inner_pos += LEGACY_LOG_OVERHEAD + inner_size
            if inner_count == 0:
                raise _invalid("compressed message holds no messages")
            count += inner_count
        else:
            count += 1
        pos += LEGACY_LOG_OVERHEAD + size
    return LegacySetInfo(magic_seen, count, max_ts)


def patch_legacy_offsets(buf: bytearray, base_offset: int) -> int:
    """Assign offsets from `base_offset` to a validated v0/v1 message set; return the last offset.

    A compressed v1 wrapper takes the offset of its last inner message (inner offsets stay
    relative), as Kafka stores it. The CRC does not cover offsets.
    """
    from oncelog.protocol.compression import decompress

    next_offset = base_offset
    for message in list(iter_legacy_messages(buf)):
        if message.compression:
            inner = decompress(message.compression, bytes(_legacy_value(buf, message.position, message.magic)))
            n = sum(1 for _ in iter_legacy_messages(inner))
            next_offset += n
        else:
            next_offset += 1
        _LEGACY_OFFSET.pack_into(buf, message.position, next_offset - 1)
    return next_offset - 1
