"""Encoding records into v2 batches, the producer's hot path.

The producer keeps a batch's records as given and encodes them at drain: `encode_plain_records`
for records without key or headers (C-level steps, one join) or `encode_record` per record, laid
out behind room for the header that `seal_batch` fills in (one copy and one CRC per batch);
`build_batch` wraps records encoded elsewhere. Records use zig-zag varints (varint.py); only the
records section is compressed.

Why the fast paths look as they do (docs/benchmarks.md, "Low latency"): per-record Python is the
cost, so the common shapes are built by C-level `map`/`zip`/`join` over cached varints, records of
one value size from parts cached per size (`_uniform_parts`), and a batch is sealed in the buffer
its records were joined into, so its records are copied once.
"""
from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from itertools import chain, repeat
from operator import add
from typing import Any

from oncelog.protocol import compression
from oncelog.protocol.primitives import Buf
from oncelog.protocol.records.batch import (
    ATTR_COMPRESSION_MASK,
    ATTR_TIMESTAMP_TYPE,
    ATTR_TRANSACTIONAL,
    BATCH_HEADER,
    BATCH_OVERHEAD,
    CRC_START,
    LOG_OVERHEAD,
    BatchHeader,
    Header,
    Record,
    corrupt,
    store_crc,
)
from oncelog.protocol.records.varint import CACHE as _CACHE
from oncelog.protocol.records.varint import CACHE_LIMIT as _CACHE_LIMIT
from oncelog.protocol.records.varint import MINUS_ONE as _MINUS_ONE
from oncelog.protocol.records.varint import encode_varint as _varint_bytes

HEADER_ROOM = bytes(BATCH_OVERHEAD)   # where seal_batch writes the header
_LENGTH_POS = 8  # batchLength, after baseOffset
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


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


def encode_plain_records(values: Sequence[bytes | None], timestamp_deltas: Sequence[int], header_room: bool = False
                         ) -> bytes | bytearray:
    """The records section of a batch whose records have no key and no headers (the producer's
    common case), offset deltas 0..n-1, in one join. With `header_room`, a bytearray that
    starts with BATCH_OVERHEAD zero bytes for `seal_batch` to fill."""
    join = bytearray().join if header_room else b"".join
    first = (HEADER_ROOM,) if header_room else ()
    n = len(values)
    lim = _CACHE_LIMIT
    if 0 < n < lim and None not in values:
        # mypy does not narrow on `None not in values`
        lengths = list(map(len, values))  # type: ignore[arg-type]
        low, high, size = min(timestamp_deltas), max(timestamp_deltas), lengths[0]
        get = _CACHE.__getitem__
        if low >= 0 and high < 64 and size < lim - 64 and lengths.count(size) == n:
            # values of one size, timestamp deltas of one byte: all that is not the value or
            # the delta repeats from batch to batch (_uniform_parts)
            before, after = _uniform_parts(size, n)
            return join(chain(first, chain.from_iterable(zip(
                before, map(get, timestamp_deltas), after, values)), (b"\x00",)))  # type: ignore[arg-type]
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
    out: list[bytes] = list(first)
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


_UNIFORM: dict[int, tuple[list[bytes], list[bytes]]] = {}


def _uniform_parts(size: int, n: int) -> tuple[list[bytes], list[bytes]]:
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


def record_size_upper_bound(key: bytes | None, value: bytes | None, headers: Sequence[Header] | None = None) -> int:
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
        buf, 0, base_offset, len(buf) - LOG_OVERHEAD, partition_leader_epoch, 2, 0, attributes,
        count - 1 if last_offset_delta is None else last_offset_delta,
        base_timestamp, base_timestamp if max_timestamp is None else max_timestamp,
        producer_id, producer_epoch, base_sequence, count)
    store_crc(buf, 0, len(buf))
    return buf


def encode_batch(records: Iterable[Record | tuple[Any, ...]], *, base_offset: int = 0, compression: int = 0,
                 producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                 transactional: bool = False, timestamp_type: int = 0) -> bytearray:
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


def recompress(buf: Buf, headers: list[BatchHeader], codec: int) -> bytearray:
    """The v2 batches of `buf` (validated; `headers` are theirs, in order) with their records
    under `codec`, as Kafka's LogValidator recompresses for a topic's compression.type. The
    records section is decompressed and compressed as a whole, never record by record; every
    header field but length, codec and CRC is kept (producer id, epoch and sequence, timestamps,
    offsets, transactional flag). A batch already under `codec` is copied unchanged."""
    out = bytearray()
    view = memoryview(buf)
    pos = 0
    for h in headers:
        end = pos + h.size
        if h.compression == codec:
            out += view[pos:end]
        else:
            try:
                raw = compression.decompress(h.compression, view[pos + BATCH_OVERHEAD:end])
            except Exception as e:  # noqa: BLE001 - cramjam's errors, or an unknown codec number
                raise corrupt(f"record batch at offset {h.base_offset} does not decompress: {e}") from None
            start = len(out)
            out += view[pos:pos + BATCH_OVERHEAD]
            out += compression.compress(codec, raw) if codec else raw
            _I32.pack_into(out, start + _LENGTH_POS, len(out) - start - LOG_OVERHEAD)
            _I16.pack_into(out, start + CRC_START, (h.attributes & ~ATTR_COMPRESSION_MASK) | codec)
            store_crc(out, start, len(out))
        pos = end
    return out
