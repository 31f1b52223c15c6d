"""v0/v1 message sets (magic 0 and 1, one CRC-32 per message): read, validated and given offsets.

A topic may keep an old `message.format.version`, so the broker accepts and stores them and the
consumer reads them; none of this is on a hot path. A compressed message (a wrapper) holds a
message set of its own as its value: magic 0 inner messages carry absolute offsets, magic 1 inner
offsets are relative (0, 1, 2, ...) and the wrapper carries the absolute offset of the last one.
"""
from __future__ import annotations

import struct
import zlib
from typing import Any, NamedTuple

from oncelog.protocol import compression
from oncelog.protocol.errors import KafkaProtocolError
from oncelog.protocol.primitives import Buf
from oncelog.protocol.records.batch import (
    ATTR_COMPRESSION_MASK,
    ATTR_TIMESTAMP_TYPE,
    LEGACY_TIMESTAMP_POS,
    MAGIC_POS,
    BatchHeader,
    Record,
    WritableBuf,
    corrupt,
    invalid,
    iter_batches,
)
from oncelog.protocol.records.encode import encode_batch

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_MAGIC_AND_ATTRIBUTES = struct.Struct(">bb")


def parse_message_format_version(value: Any) -> int:
    """The record magic a topic's `message.format.version` allows, by Kafka's names: "0.8.x" and
    "0.9.x" -> 0, "0.10.x" -> 1, "0.11.0" and later ("2.8", "3.0-IV1") -> 2; oncelog also takes
    the magic itself ("v0".."v2", 0..2). None -> 2. ValueError for anything else."""
    if value is None:
        return 2
    if isinstance(value, int) and not isinstance(value, bool):
        return max(0, min(2, value))
    text = str(value).strip().lower().lstrip("v")
    if text in ("0", "1", "2"):
        return int(text)
    parts = text.split("-")[0].split(".")
    if not all(p.isdigit() for p in parts[:2]):
        raise ValueError(f"message.format.version={value!r} is not a version like 0.10.2 or 3.0")
    major, minor = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    if major == 0:
        return 0 if minor < 10 else 1 if minor == 10 else 2
    return 2


def message_format_magic(value: Any) -> int:
    """`parse_message_format_version`, reading what it cannot parse as the current format (a
    stored value from elsewhere, or a foreign broker's answer, must not stop a start or a send)."""
    try:
        return parse_message_format_version(value)
    except ValueError:
        return 2


def encode_legacy_message(offset: int, key: bytes | None, value: bytes | None, *, magic: int = 1,
                          timestamp: int = -1, compression_codec: int = 0, timestamp_type: int = 0) -> bytes:
    """One v0/v1 message (a message set entry). Used for tests and old-format fixtures."""
    attributes = (compression_codec & ATTR_COMPRESSION_MASK) | (ATTR_TIMESTAMP_TYPE if timestamp_type else 0)
    body = bytearray(_MAGIC_AND_ATTRIBUTES.pack(magic, attributes))
    if magic == 1:
        body += _I64.pack(timestamp)
    for b in (key, value):
        if b is None:
            body += _I32.pack(-1)
        else:
            body += _I32.pack(len(b)) + b
    crc = zlib.crc32(body)
    return struct.pack(">qiI", offset, len(body) + 4, crc) + bytes(body)


def _key_and_value(buf: Buf, pos: int, header: BatchHeader) -> tuple[memoryview | None, memoryview | None]:
    """The key and value of the message at `pos` (a wrapper's value is its compressed inner set)."""
    mv = memoryview(buf)
    end = pos + header.size
    p = pos + LEGACY_TIMESTAMP_POS + (8 if header.magic == 1 else 0)
    out: list[memoryview | None] = []
    for _field in ("key", "value"):
        if p + 4 > end:
            raise corrupt("message ends inside its key or value length")
        n = _I32.unpack_from(mv, p)[0]
        p += 4
        if n < 0:
            out.append(None)
            continue
        if p + n > end:
            raise corrupt("message key or value runs past the message end")
        out.append(mv[p:p + n])
        p += n
    return out[0], out[1]


def _inner_set(buf: Buf, pos: int, header: BatchHeader) -> bytes:
    _key, value = _key_and_value(buf, pos, header)
    return compression.decompress(header.compression, bytes(value or b""))


def decode_legacy_entry(entry: memoryview, header: BatchHeader, check_crc: bool
                        ) -> tuple[BatchHeader, list[Record]]:
    """The records of one top-level v0/v1 message (its inner messages for a wrapper), and its
    header spanning their offsets."""
    if check_crc and zlib.crc32(entry[MAGIC_POS:header.size]) != header.crc:
        raise corrupt(f"CRC mismatch in message at offset {header.base_offset}")
    offset, magic, timestamp = header.base_offset, header.magic, header.max_timestamp
    ts_type = 1 if (magic == 1 and header.attributes & ATTR_TIMESTAMP_TYPE) else 0
    key, value = _key_and_value(entry, 0, header)
    if not header.compression:
        records = [Record(offset, timestamp, None if key is None else bytes(key),
                          None if value is None else bytes(value), (), ts_type)]
    else:
        inner_set = compression.decompress(header.compression, bytes(value or b""))
        inner: list[Record] = []
        mv = memoryview(inner_set)
        for pos, inner_header in iter_batches(mv, strict=True):
            if inner_header.magic > 1:
                raise corrupt("a v2 batch inside a v0/v1 message")
            inner.extend(decode_legacy_entry(mv[pos:pos + inner_header.size], inner_header, check_crc)[1])
        if magic == 1 and inner:
            # v1 inner offsets are relative; the wrapper carries the absolute offset of the last one
            shift = offset - inner[-1].offset
            inner = [r._replace(offset=r.offset + shift) for r in inner]
        if ts_type == 1:
            inner = [r._replace(timestamp=timestamp, timestamp_type=1) for r in inner]
        records = inner
    first = records[0].offset if records else offset
    last = records[-1].offset if records else offset
    return header._replace(base_offset=first, last_offset_delta=last - first,
                           records_count=len(records)), records


def _check_message(buf: Buf, pos: int, header: BatchHeader, magic_expected: int | None) -> None:
    if header.magic not in (0, 1):
        raise corrupt(f"message magic {header.magic} in a v0/v1 message set")
    if magic_expected is not None and header.magic != magic_expected:
        raise invalid("a message set mixes magic 0 and magic 1")
    if zlib.crc32(memoryview(buf)[pos + MAGIC_POS:pos + header.size]) != header.crc:
        raise corrupt("message CRC-32 mismatch")


class LegacySetInfo(NamedTuple):
    magic: int
    message_count: int  # counting the messages inside compressed wrappers
    max_timestamp: int


def validate_legacy_message_set(buf: Buf) -> LegacySetInfo:
    """Validate a produced v0/v1 message set: every CRC, sizes, one magic, inner sets of wrappers.

    Compressed magic-0 wrappers are refused: their inner messages carry absolute offsets, which the
    broker would have to recompress to assign; no maintained client sends them.
    """
    if len(buf) == 0:
        raise invalid("empty message set")
    count, magic, max_ts = 0, -1, -1
    for pos, header in iter_batches(buf, exact=True):
        _check_message(buf, pos, header, None if magic < 0 else magic)
        magic = header.magic
        if header.magic == 1:
            max_ts = max(max_ts, header.max_timestamp)
        if not header.compression:
            count += 1
            continue
        if header.magic == 0:
            raise invalid("compressed magic-0 message sets are not supported; use magic 1 or 2")
        try:
            inner = _inner_set(buf, pos, header)
        except Exception as exc:  # noqa: BLE001 - a codec error is a corrupt message, whatever the library
            raise corrupt(f"compressed message set does not decompress: {exc}") from None
        inner_count = 0
        for inner_pos, inner_header in iter_batches(inner, exact=True):
            _check_message(inner, inner_pos, inner_header, 1)
            if inner_header.compression:
                raise invalid("nested compressed message")
            if inner_header.base_offset != inner_count:
                raise invalid("inner offsets of a compressed message set must be 0, 1, 2, ...")
            inner_count += 1
        if inner_count == 0:
            raise invalid("compressed message holds no messages")
        count += inner_count
    return LegacySetInfo(magic, count, max_ts)


def upconvert_legacy_message_set(buf: Buf, codec: int | None) -> bytearray:
    """A produced v0/v1 message set as the one v2 batch Kafka's LogValidator stores on a topic of
    the current format: every CRC checked, one magic, wrappers' inner sets expanded, the records
    under `codec` (None: the wrapper's codec, or none), no producer id. Each record keeps the
    timestamp it has: -1 (no timestamp) for magic 0, its own (or its LogAppendTime wrapper's) for
    magic 1; offsets and a LogAppendTime topic's time are the log's to set, as for any batch.

    As Kafka: a compressed set is its one wrapper; a wrapper holds uncompressed messages of its
    own magic (their offsets are not checked, since all are reassigned; so compressed magic-0
    sets, which carry absolute inner offsets, are accepted here)."""
    if len(buf) == 0:
        raise invalid("empty message set")
    mv = memoryview(buf)
    entries = list(iter_batches(mv, exact=True))
    magic = entries[0][1].magic
    source_codec = 0
    records: list[Record] = []
    for pos, header in entries:
        _check_message(mv, pos, header, magic)
        if not header.compression:
            records.extend(decode_legacy_entry(mv[pos:pos + header.size], header, False)[1])
            continue
        source_codec = header.compression
        if len(entries) > 1:
            raise invalid("a compressed message set holds one message, its wrapper")
        try:
            inner = memoryview(_inner_set(mv, pos, header))
        except KafkaProtocolError:
            raise
        except Exception as exc:  # noqa: BLE001 - a codec error is a corrupt message, whatever the library
            raise corrupt(f"compressed message set does not decompress: {exc}") from None
        for inner_pos, inner_header in iter_batches(inner, exact=True):
            _check_message(inner, inner_pos, inner_header, magic)
            if inner_header.compression:
                raise invalid("nested compressed message")
            records.extend(decode_legacy_entry(inner[inner_pos:inner_pos + inner_header.size],
                                               inner_header, False)[1])
        if magic == 1 and header.attributes & ATTR_TIMESTAMP_TYPE:
            records = [r._replace(timestamp=header.max_timestamp) for r in records]
    if not records:
        raise invalid("compressed message holds no messages")
    return encode_batch([(0, r.timestamp, r.key, r.value) for r in records],
                        compression=source_codec if codec is None else codec)


def patch_legacy_offsets(buf: WritableBuf, base_offset: int) -> int:
    """Assign offsets from `base_offset` to a validated v0/v1 message set; return the last offset.

    A compressed v1 wrapper takes the offset of its last inner message (inner offsets stay
    relative), as Kafka stores it. The CRC does not cover offsets.
    """
    next_offset = base_offset
    for pos, header in list(iter_batches(buf)):
        if header.compression:
            next_offset += sum(1 for _ in iter_batches(_inner_set(buf, pos, header)))
        else:
            next_offset += 1
        _I64.pack_into(buf, pos, next_offset - 1)
    return next_offset - 1

