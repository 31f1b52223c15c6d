"""Decoding records: what a consumer (and ListOffsets by time) reads out of batches."""
from __future__ import annotations

from collections.abc import Iterator

from oncelog.protocol import compression
from oncelog.protocol.records.batch import BATCH_OVERHEAD, BatchHeader, Header, Record, check_crc, corrupt, iter_batches
from oncelog.protocol.records.legacy import decode_legacy_entry
from oncelog.protocol.records.varint import decode_varint


def decode_batch(buf: bytes | bytearray | memoryview) -> list[Record]:
    """All records of the first batch (or legacy message set entry) in `buf`."""
    for _header, records in iter_record_batches(buf):
        return records
    raise corrupt("no complete batch in buffer")


def decode_records(buf: bytes | bytearray | memoryview, *, include_control: bool = False) -> list[Record]:
    """Every record of every complete batch in `buf` (a Fetch response's records)."""
    out: list[Record] = []
    for header, records in iter_record_batches(buf):
        if header.is_control and not include_control:
            continue
        out.extend(records)
    return out


def iter_record_batches(buf: bytes | bytearray | memoryview, *, check_crc: bool = True
                        ) -> Iterator[tuple[BatchHeader, list[Record]]]:
    """(header, records) for each complete batch; a truncated tail (normal in Fetch) is skipped.
    A v0/v1 entry's header spans the offsets of the records it holds (see legacy.py)."""
    mv = memoryview(buf)
    for pos, header in iter_batches(mv, strict=True):
        if header.magic == 2:
            yield header, _decode_v2(mv, pos, header, check_crc)
        else:
            yield decode_legacy_entry(mv[pos:pos + header.size], header, check_crc)


def _decode_v2(mv: memoryview, pos: int, header: BatchHeader, verify_crc: bool) -> list[Record]:
    if verify_crc:
        check_crc(mv, pos, header)
    (base_offset, _length, _epoch, _magic, _crc, attributes, _last_delta, base_ts, max_ts, _pid,
     _pepoch, _base_seq, count) = header
    codec = header.compression
    ts_type = header.timestamp_type
    data = mv[pos + BATCH_OVERHEAD:pos + header.size]
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
            headers: tuple[Header, ...] = ()
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
                raise corrupt("record length mismatch")
            append(Record(base_offset + off_delta, max_ts if log_append else base_ts + ts_delta,
                          key, value, headers, ts_type))
    except IndexError:
        raise corrupt("record runs past the batch end") from None
    return records


def iter_record_times(entry: bytes | bytearray | memoryview) -> Iterator[tuple[int, int]]:
    """(offset, timestamp) of each record of one stored batch or v0/v1 entry, in order, as
    Kafka's record iterator gives them: LogAppendTime records take the batch's timestamp.

    For ListOffsets by time, which needs the first record at or after a time inside the one batch
    its search found: a v2 record is read only up to its offset delta and skipped by its length,
    so keys, values and headers are never copied."""
    mv = memoryview(entry)
    first = next(iter_batches(mv, strict=True), None)
    if first is None:
        raise corrupt("entry shorter than its header")
    header = first[1]
    if header.magic != 2:
        for r in decode_legacy_entry(mv[:header.size], header, False)[1]:
            yield r.offset, r.timestamp
        return
    base_offset, base_ts, max_ts, count = (header.base_offset, header.base_timestamp,
                                           header.max_timestamp, header.records_count)
    data = mv[BATCH_OVERHEAD:header.size]
    codec = header.compression
    if codec:
        try:
            data = memoryview(compression.decompress(codec, data))
        except Exception as exc:  # noqa: BLE001 - the broker stores compressed records unread: a codec error is corruption
            raise corrupt(f"batch does not decompress: {exc}") from None
    log_append = header.timestamp_type
    pos = 0
    for _ in range(count):
        try:
            length, pos = decode_varint(data, pos)
            end = pos + length
            ts_delta, p = decode_varint(data, pos + 1)  # past the record's attributes
            off_delta, _p = decode_varint(data, p)
        except IndexError:
            raise corrupt("record runs past the batch end") from None
        yield base_offset + off_delta, max_ts if log_append else base_ts + ts_delta
        pos = end
