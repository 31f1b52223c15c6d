"""Client-side record encoding and decoding: record batch v2, and v0/v1 message sets for reading.

Record batch v2 (KIP-98), all integers big-endian:
    baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 (2) | crc u32 |
    attributes i16 | lastOffsetDelta i32 | baseTimestamp i64 | maxTimestamp i64 |
    producerId i64 | producerEpoch i16 | baseSequence i32 | recordCount i32 | records
The CRC-32C covers attributes..end, so the broker can patch baseOffset and the leader epoch without
recomputing it. Records use zig-zag varints; only the records section is compressed.

The producer keeps a batch's records as given and encodes them at drain: `encode_plain_records`
for records without key or headers (C-level steps, one join) or `encode_record` per record, laid
out behind room for the header that `seal_batch` fills in (one copy and one CRC per batch);
`build_batch` wraps records encoded elsewhere.
"""
from __future__ import annotations

import struct
from itertools import chain, repeat
from operator import add
from typing import Iterable, Iterator, NamedTuple, Sequence

from crc32c import crc32c

from oncelog.protocol import compression
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")  # the 61-byte v2 batch header
CRC_START = 21  # offset of attributes: baseOffset(8) batchLength(4) epoch(4) magic(1) crc(4)
_PRODUCER_FIELDS = struct.Struct(">qhi")  # producerId, producerEpoch, baseSequence at offset 43
_PRODUCER_FIELDS_POS = 43
BATCH_OVERHEAD = BATCH_HEADER.size
HEADER_ROOM = bytes(BATCH_OVERHEAD)   # where seal_batch writes the header

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20

Header = tuple[str, bytes | None]


class Record(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp_type: int = 0  # 0 CreateTime, 1 LogAppendTime


class BatchInfo(NamedTuple):
    """Batch-level facts a consumer needs besides the records."""
    base_offset: int
    last_offset: int
    magic: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_transactional: bool
    is_control: bool
    size: int


# ---------------------------------------------------------------- varints

def _varint_bytes(n: int) -> bytes:
    """Zig-zag varint of a signed 64-bit value."""
    if 0 <= n < _CACHE_LIMIT:
        return _CACHE[n]
    return _varint_slow(n)


def _varint_slow(n: int) -> bytes:
    v = (n << 1) ^ (n >> 63)
    if v < 0x80:
        return _SMALL[v]
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


_SMALL = [bytes([i]) for i in range(0x80)]
# lengths, offset and timestamp deltas are small non-negative numbers: precompute their varints
_CACHE_LIMIT = 1 << 14
_CACHE = [_varint_slow(i) for i in range(_CACHE_LIMIT)]
_MINUS_ONE = _varint_bytes(-1)


def encode_varint(n: int) -> bytes:
    return _varint_bytes(n)


def decode_varint(buf, pos: int) -> tuple[int, int]:
    """Decode a zig-zag varint at `pos`; returns (value, new position)."""
    shift = 0
    result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, "varint longer than 10 bytes")
    return (result >> 1) ^ -(result & 1), pos


# ---------------------------------------------------------------- encoding

def _bytes_field(b: bytes | str | None) -> bytes:
    if b is None:
        return _MINUS_ONE
    if isinstance(b, str):
        b = b.encode()
    return _varint_bytes(len(b)) + b


def encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None,
                  value: bytes | None, headers: Sequence[Header] | None = None) -> bytes:
    """One record of a v2 batch, length prefix included."""
    if not headers and key is None and value is not None and 0 <= timestamp_delta < _CACHE_LIMIT \
            and offset_delta < _CACHE_LIMIT and len(value) < _CACHE_LIMIT - 64:
        # the common producer case, in one join
        c = _CACHE
        vl = len(value)
        td, od, vb = c[timestamp_delta], c[offset_delta], c[vl]
        n = 3 + len(td) + len(od) + len(vb) + vl   # attrs, key -1, headers 0
        return b"".join((c[n], b"\x00", td, od, b"\x01", vb, value, b"\x00"))
    if headers:
        hparts = [_varint_bytes(len(headers))]
        for hk, hv in headers:
            hparts.append(_bytes_field(hk))
            hparts.append(_bytes_field(hv))
        hbytes = b"".join(hparts)
    else:
        hbytes = b"\x00"
    body = b"".join((
        b"\x00",  # record attributes (unused)
        _varint_bytes(timestamp_delta),
        _varint_bytes(offset_delta),
        _MINUS_ONE if key is None else _varint_bytes(len(key)) + key,
        _MINUS_ONE if value is None else _varint_bytes(len(value)) + value,
        hbytes,
    ))
    return _varint_bytes(len(body)) + body


def encode_plain_records(values: list, timestamp_deltas: list, header_room: bool = False
                         ) -> bytes | bytearray:
    """The records section of a batch whose records have no key and no headers (the producer's
    common case), offset deltas 0..n-1, in one join. With `header_room`, a bytearray that
    starts with BATCH_OVERHEAD zero bytes for `seal_batch` to fill."""
    join = bytearray().join if header_room else b"".join
    first = (HEADER_ROOM,) if header_room else ()
    n = len(values)
    lim = _CACHE_LIMIT
    if 0 < n < lim and None not in values:
        lengths = list(map(len, values))
        low, high, size = min(timestamp_deltas), max(timestamp_deltas), lengths[0]
        get = _CACHE.__getitem__
        if low >= 0 and high < 64 and size < lim - 64 and lengths.count(size) == n:
            # values of one size, timestamp deltas of one byte: all that is not the value or
            # the delta repeats from batch to batch (_uniform_parts)
            before, after = _uniform_parts(size, n)
            return join(chain(first, chain.from_iterable(zip(
                before, map(get, timestamp_deltas), after, values)), (b"\x00",)))
        if low >= 0 and high < lim and max(lengths) < lim - 64:
            # every varint from the cache, every step a C-level map: a record is length,
            # attributes 0, timestamp delta, offset delta, key -1, value length, value, no headers
            ts = list(map(get, timestamp_deltas))
            offs = _CACHE[:n]
            lens = list(map(get, lengths))
            sizes = map(add, map(add, map(len, ts), map(len, offs)), map(add, map(len, lens), lengths))
            prefixes = map(get, map(add, sizes, repeat(3)))
            return join(chain(first, chain.from_iterable(zip(
                prefixes, repeat(b"\x00"), ts, offs, repeat(b"\x01"), lens, values, repeat(b"\x00")))))
    c = _CACHE
    vb = _varint_bytes
    out: list = list(first)
    ext = out.extend
    for i, (v, td) in enumerate(zip(values, timestamp_deltas)):
        t = c[td] if 0 <= td < lim else vb(td)
        o = c[i] if i < lim else vb(i)
        if v is None:
            ext((c[4 + len(t) + len(o)], b"\x00", t, o, b"\x01\x01\x00"))
            continue
        ln = len(v)
        lb = c[ln] if ln < lim else vb(ln)
        ln += 3 + len(t) + len(o) + len(lb)
        ext((c[ln] if ln < lim else vb(ln), b"\x00", t, o, b"\x01", lb, v, b"\x00"))
    return join(out)


_UNIFORM: dict[int, tuple[list, list]] = {}


def _uniform_parts(size: int, n: int) -> tuple[list, list]:
    """For records of `size`-byte values with a one-byte timestamp delta, what comes before the
    delta (the previous record's empty header count, the length, attributes) and between the
    delta and the value (offset delta, key -1, value length), for offsets 0..n-1 at least.
    Cached per value size; entries are replaced whole, never changed, so threads may share them."""
    parts = _UNIFORM.get(size)
    if parts is not None and len(parts[0]) >= n:
        return parts
    n = max(n, 256)
    vlen = _CACHE[size]
    after = [o + b"\x01" + vlen for o in _CACHE[:n]]
    before = [b"\x00" + _CACHE[4 + len(o) + len(vlen) + size] + b"\x00" for o in _CACHE[:n]]
    before[0] = before[0][1:]   # the first record follows no other
    if len(_UNIFORM) >= 16:
        _UNIFORM.pop(next(iter(_UNIFORM)), None)
    parts = _UNIFORM[size] = (before, after)
    return parts


# the most a record adds to its key, value and headers: varints of its length (5), timestamp
# delta (10), offset delta (5), key and value lengths (5 each), header count (5); attributes (1)
RECORD_OVERHEAD = 36


def record_size_upper_bound(key: bytes | None, value: bytes | None, headers=None) -> int:
    """A record's encoded size at most, for `batch.size` and `buffer.memory` accounting."""
    n = RECORD_OVERHEAD + (len(key) if key else 0) + (len(value) if value else 0)
    if headers:
        for hk, hv in headers:
            n += 10 + len(hk) + (len(hv) if hv else 0)
    return n


def build_batch(records_data: bytes | bytearray, count: int, *, base_offset: int = 0,
                base_timestamp: int = 0, max_timestamp: int | None = None, compression_codec: int = 0,
                producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                transactional: bool = False, timestamp_type: int = 0,
                partition_leader_epoch: int = -1, last_offset_delta: int | None = None) -> bytearray:
    """Wrap already-encoded records (see `encode_record`) in a v2 batch header."""
    attributes = compression_codec & ATTR_COMPRESSION_MASK
    if timestamp_type:
        attributes |= ATTR_TIMESTAMP_TYPE
    if transactional:
        attributes |= ATTR_TRANSACTIONAL
    payload = compression.compress(compression_codec, records_data) if compression_codec else records_data
    return seal_batch(bytearray().join((HEADER_ROOM, payload)), count, base_offset=base_offset,
                      base_timestamp=base_timestamp, max_timestamp=max_timestamp,
                      attributes=attributes, producer_id=producer_id,
                      producer_epoch=producer_epoch, base_sequence=base_sequence,
                      partition_leader_epoch=partition_leader_epoch,
                      last_offset_delta=last_offset_delta)


def seal_batch(buf: bytearray, count: int, *, base_offset: int = 0, base_timestamp: int = 0,
               max_timestamp: int | None = None, attributes: int = 0, producer_id: int = -1,
               producer_epoch: int = -1, base_sequence: int = -1, partition_leader_epoch: int = -1,
               last_offset_delta: int | None = None) -> bytearray:
    """Write the v2 batch header and CRC into the first BATCH_OVERHEAD bytes of `buf`, which
    holds the (possibly compressed) records after them: a batch is built with one copy of its
    records, not two."""
    if count <= 0:
        raise ValueError("a record batch holds at least one record")
    BATCH_HEADER.pack_into(
        buf, 0, base_offset, len(buf) - 12, partition_leader_epoch, 2, 0, attributes,
        count - 1 if last_offset_delta is None else last_offset_delta,
        base_timestamp, base_timestamp if max_timestamp is None else max_timestamp,
        producer_id, producer_epoch, base_sequence, count)
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[CRC_START:]))
    return buf


def encode_batch(records: Iterable[Record | tuple], *, base_offset: int = 0, compression: int = 0,
                 producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                 transactional: bool = False, timestamp_type: int = 0) -> bytes:
    """Encode records as one v2 batch. Record offsets are taken relative to the first one's
    position (offset deltas are 0..n-1); timestamps relative to the first record's."""
    records = list(records)
    if not records:
        raise ValueError("a record batch holds at least one record")
    base_ts = records[0][1]
    max_ts = base_ts
    parts = []
    for i, r in enumerate(records):
        ts = r[1]
        if ts > max_ts:
            max_ts = ts
        headers = r[4] if len(r) > 4 else ()
        parts.append(encode_record(i, ts - base_ts, r[2], r[3], headers))
    return build_batch(b"".join(parts), len(records), base_offset=base_offset, base_timestamp=base_ts,
                       max_timestamp=max_ts, compression_codec=compression, producer_id=producer_id,
                       producer_epoch=producer_epoch, base_sequence=base_sequence,
                       transactional=transactional, timestamp_type=timestamp_type)


def rewrite_producer_state(batch: bytes | bytearray, producer_id: int, producer_epoch: int,
                           base_sequence: int) -> bytes:
    """The same batch under another producer id/epoch/sequence (epoch bump, fallback to plain
    producing); recomputes the CRC, leaves the records untouched."""
    buf = bytearray(batch)
    _PRODUCER_FIELDS.pack_into(buf, _PRODUCER_FIELDS_POS, producer_id, producer_epoch, base_sequence)
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[CRC_START:]))
    return bytes(buf)


# ---------------------------------------------------------------- decoding

def decode_batch(buf: bytes | bytearray | memoryview) -> list[Record]:
    """All records of the first batch (or legacy message set entry) in `buf`."""
    for _info, records in iter_record_batches(buf):
        return records
    raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, "no complete batch in buffer")


def decode_records(buf: bytes | bytearray | memoryview, *, include_control: bool = False) -> list[Record]:
    """Every record of every complete batch in `buf` (a Fetch response's records)."""
    out: list[Record] = []
    for info, records in iter_record_batches(buf):
        if info.is_control and not include_control:
            continue
        out.extend(records)
    return out


def iter_record_batches(buf: bytes | bytearray | memoryview, *, check_crc: bool = True
                        ) -> Iterator[tuple[BatchInfo, list[Record]]]:
    """(batch info, records) for each complete batch; a truncated tail (normal in Fetch) is skipped."""
    mv = memoryview(buf)
    pos = 0
    end = len(mv)
    while end - pos >= 17:
        base_offset, size = struct.unpack_from(">qi", mv, pos)
        if size < 0 or pos + 12 + size > end:
            return
        magic = mv[pos + 16]
        chunk = mv[pos:pos + 12 + size]
        if magic == 2:
            yield _decode_v2(chunk, check_crc)
        elif magic in (0, 1):
            yield _decode_legacy_entry(chunk, check_crc)
        else:
            raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, f"unknown magic byte {magic}")
        pos += 12 + size


class BatchSpan(NamedTuple):
    """Where one complete batch (or legacy message-set entry) sits in a buffer."""
    start: int
    end: int
    base_offset: int
    last_offset: int
    magic: int


def batch_spans(buf: bytes | bytearray | memoryview) -> Iterator[BatchSpan]:
    """The complete batches in `buf`, from their headers alone (no CRC, no records): what a
    consumer that hands raw batches to a columnar decoder needs to advance its position."""
    pos = 0
    end = len(buf)
    while end - pos >= 17:
        base_offset, size = struct.unpack_from(">qi", buf, pos)
        if size < 0 or pos + 12 + size > end:
            return
        magic = buf[pos + 16]
        if magic == 2:
            if size < BATCH_OVERHEAD - 12:
                raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, "record batch shorter than its header")
            last = base_offset + struct.unpack_from(">i", buf, pos + 23)[0]
        elif magic in (0, 1):
            last = base_offset   # a compressed wrapper's offset is its last inner record's
        else:
            raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, f"unknown magic byte {magic}")
        yield BatchSpan(pos, pos + 12 + size, base_offset, last, magic)
        pos += 12 + size


def _decode_v2(mv: memoryview, check_crc: bool) -> tuple[BatchInfo, list[Record]]:
    if len(mv) < BATCH_OVERHEAD:
        raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, "record batch shorter than its header")
    (base_offset, _length, _epoch, _magic, crc, attributes, last_delta, base_ts, max_ts, pid, pepoch,
     base_seq, count) = BATCH_HEADER.unpack_from(mv, 0)
    if check_crc and crc32c(mv[CRC_START:]) != crc:
        raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE,
                                 f"CRC mismatch in batch at offset {base_offset}")
    codec = attributes & ATTR_COMPRESSION_MASK
    ts_type = 1 if attributes & ATTR_TIMESTAMP_TYPE else 0
    data = mv[BATCH_OVERHEAD:]
    if codec:
        data = memoryview(compression.decompress(codec, data))
    records: list[Record] = []
    append = records.append
    pos = 0
    log_append = ts_type == 1
    try:
        for _ in range(count):
            length, pos = decode_varint(data, pos)
            rec_end = pos + length
            pos += 1  # record attributes
            ts_delta, pos = decode_varint(data, pos)
            off_delta, pos = decode_varint(data, pos)
            klen, pos = decode_varint(data, pos)
            if klen < 0:
                key = None
            else:
                key = bytes(data[pos:pos + klen])
                pos += klen
            vlen, pos = decode_varint(data, pos)
            if vlen < 0:
                value = None
            else:
                value = bytes(data[pos:pos + vlen])
                pos += vlen
            hcount, pos = decode_varint(data, pos)
            headers: tuple = ()
            if hcount > 0:
                hl = []
                for _h in range(hcount):
                    hklen, pos = decode_varint(data, pos)
                    hk = bytes(data[pos:pos + hklen]).decode()
                    pos += hklen
                    hvlen, pos = decode_varint(data, pos)
                    if hvlen < 0:
                        hv = None
                    else:
                        hv = bytes(data[pos:pos + hvlen])
                        pos += hvlen
                    hl.append((hk, hv))
                headers = tuple(hl)
            if pos != rec_end:
                raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, "record length mismatch")
            append(Record(base_offset + off_delta, max_ts if log_append else base_ts + ts_delta,
                          key, value, headers, ts_type))
    except IndexError:
        raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, "record runs past the batch end") from None
    info = BatchInfo(base_offset, base_offset + last_delta, 2, pid, pepoch, base_seq,
                     bool(attributes & ATTR_TRANSACTIONAL), bool(attributes & ATTR_CONTROL), len(mv))
    return info, records


def iter_record_times(entry: bytes | bytearray | memoryview) -> Iterator[tuple[int, int]]:
    """(offset, timestamp) of each record of one stored batch or v0/v1 entry, in order, as
    Kafka's record iterator gives them: LogAppendTime records take the batch's timestamp.

    For ListOffsets by time, which needs the first record at or after a time inside the one batch
    its search found: a v2 record is read only up to its offset delta and skipped by its length,
    so keys, values and headers are never copied."""
    mv = memoryview(entry)
    if len(mv) < 17:
        raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, "entry shorter than its header")
    if mv[16] != 2:
        for r in _decode_legacy_entry(mv, False)[1]:
            yield r.offset, r.timestamp
        return
    if len(mv) < BATCH_OVERHEAD:
        raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, "record batch shorter than its header")
    (base_offset, _length, _epoch, _magic, _crc, attributes, _last_delta, base_ts, max_ts, _pid,
     _pepoch, _base_seq, count) = BATCH_HEADER.unpack_from(mv, 0)
    data = mv[BATCH_OVERHEAD:]
    codec = attributes & ATTR_COMPRESSION_MASK
    if codec:
        try:
            data = memoryview(compression.decompress(codec, data))
        except Exception as exc:  # the broker stores compressed records unread: a codec error is corruption
            raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, f"batch does not decompress: {exc}") from None
    log_append = attributes & ATTR_TIMESTAMP_TYPE
    pos = 0
    for _ in range(count):
        try:
            length, pos = decode_varint(data, pos)
            end = pos + length
            ts_delta, p = decode_varint(data, pos + 1)  # past the record's attributes
            off_delta, _p = decode_varint(data, p)
        except IndexError:
            raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, "record runs past the batch end") from None
        yield base_offset + off_delta, max_ts if log_append else base_ts + ts_delta
        pos = end


# ---------------------------------------------------------------- v0 / v1 message sets

_LEGACY_HEAD = struct.Struct(">qiIbb")  # offset, size, crc, magic, attributes


def encode_legacy_message(offset: int, key: bytes | None, value: bytes | None, *, magic: int = 1,
                          timestamp: int = -1, compression_codec: int = 0, timestamp_type: int = 0) -> bytes:
    """One v0/v1 message (a message set entry). Used for tests and old-format fixtures."""
    import zlib
    attributes = (compression_codec & 0x07) | (ATTR_TIMESTAMP_TYPE if timestamp_type else 0)
    body = bytearray(struct.pack(">bb", magic, attributes))
    if magic == 1:
        body += struct.pack(">q", timestamp)
    for b in (key, value):
        if b is None:
            body += struct.pack(">i", -1)
        else:
            body += struct.pack(">i", len(b)) + b
    crc = zlib.crc32(body)
    return struct.pack(">qiI", offset, len(body) + 4, crc) + bytes(body)


def _decode_legacy_entry(mv: memoryview, check_crc: bool) -> tuple[BatchInfo, list[Record]]:
    import zlib
    offset, size, crc, magic, attributes = _LEGACY_HEAD.unpack_from(mv, 0)
    if check_crc and zlib.crc32(mv[16:12 + size]) != crc:
        raise KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, f"CRC mismatch in message at offset {offset}")
    pos = 18
    timestamp = -1
    if magic == 1:
        (timestamp,) = struct.unpack_from(">q", mv, pos)
        pos += 8
    (klen,) = struct.unpack_from(">i", mv, pos)
    pos += 4
    key = None if klen < 0 else bytes(mv[pos:pos + klen])
    pos += max(klen, 0)
    (vlen,) = struct.unpack_from(">i", mv, pos)
    pos += 4
    value = None if vlen < 0 else bytes(mv[pos:pos + vlen])
    codec = attributes & 0x07
    ts_type = 1 if (magic == 1 and attributes & ATTR_TIMESTAMP_TYPE) else 0
    if codec == 0:
        records = [Record(offset, timestamp, key, value, (), ts_type)]
    else:
        inner: list[Record] = []
        for _info, recs in iter_record_batches(compression.decompress(codec, value or b""),
                                               check_crc=check_crc):
            inner.extend(recs)
        if magic == 1 and inner:
            # v1 inner offsets are relative; the wrapper carries the absolute offset of the last one
            shift = offset - inner[-1].offset
            inner = [r._replace(offset=r.offset + shift) for r in inner]
        if ts_type == 1:
            inner = [r._replace(timestamp=timestamp, timestamp_type=1) for r in inner]
        records = inner
    last = records[-1].offset if records else offset
    first = records[0].offset if records else offset
    return BatchInfo(first, last, magic, -1, -1, -1, False, False, len(mv)), records
