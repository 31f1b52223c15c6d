"""Reads found by entry frames (`PartitionLog.read` / `read_region`) answer exactly what the
earlier read answered — it read max_bytes from the first entry and walked every header in them —
for every start, size limit, offset limit and min_one, over segments of batches from 61 bytes
to beyond the index interval, v0/v1 messages among them, and compaction's offset gaps; a region
is a duplicate descriptor that outlives its segment file."""
import os

import pytest

from oncelog.protocol.records import Record, encode_batch, encode_legacy_message
from oncelog.storage.log import LogConfig, PartitionLog
from oncelog.storage.segment import scan_entries

NOW = 1_700_000_000_000


def reference_read(log: PartitionLog, offset: int, max_bytes: int, max_offset: int | None, min_one: bool) -> bytes:
    """The read as it was before regions (a 4 MB read to find the first entry, max_bytes read
    from it, every header walked)."""
    log._check_offset(offset)
    if offset >= (log.log_end_offset if max_offset is None else min(max_offset, log.log_end_offset)):
        return b""
    for seg in log.segments[log._segment_for(offset):]:
        start = None
        for e, _chunk in seg.entries_from(seg.position_for(offset)):
            if e.last_offset >= offset:
                start = e.position, e.size
                break
        if start is None:
            continue
        pos, first_size = start
        if first_size > max_bytes and not min_one:
            return b""
        want = max(max_bytes, first_size)
        data = os.pread(seg.fd, min(want, seg.size - pos), pos)
        end = 0
        for e in scan_entries(data):
            if (e.position + e.size > len(data) or (end and e.position + e.size > max_bytes)
                    or (max_offset is not None and e.first_offset >= max_offset)):
                break
            end = e.position + e.size
        return bytes(data[:end])
    return b""


def sizes():
    """Record counts and value sizes: tiny batches, some around the index interval, some far above."""
    pattern = [(1, 1), (3, 10), (1, 3000), (2, 2500), (5, 200), (1, 9000), (4, 1), (1, 20000), (2, 50)]
    return [pattern[i % len(pattern)] for i in range(40)]


@pytest.fixture
def log(tmp_path):
    log = PartitionLog.open(tmp_path / "p", LogConfig(segment_bytes=60_000, index_interval_bytes=4096), NOW)
    for i, (n, size) in enumerate(sizes()):
        if i % 13 == 7:   # a v0/v1 message between batches (a topic whose format changed)
            log.append(bytearray(encode_legacy_message(0, None, b"legacy-%d" % i, magic=1, timestamp=NOW)), NOW)
        log.append(bytearray(encode_batch([Record(j, NOW, None, b"x" * size, []) for j in range(n)])), NOW)
    log.durable_end_offset = log.log_end_offset
    yield log
    log.close()


def cases(log: PartitionLog):
    end = log.log_end_offset
    limits = [1, 61, 100, 4096, 5000, 9200, 30_000, 1 << 20]
    for offset in range(0, end, 3):
        for max_bytes in limits:
            for max_offset in (None, offset + 1, offset + 7, end - 5, end):
                for min_one in (True, False):
                    yield offset, max_bytes, max_offset, min_one


def test_reads_answer_exactly_what_the_copying_read_answered(log):
    assert len(log.segments) > 2
    n = 0
    for offset, max_bytes, max_offset, min_one in cases(log):
        want = reference_read(log, offset, max_bytes, max_offset, min_one)
        got = log.read(offset, max_bytes, max_offset, min_one)
        assert got == want, (offset, max_bytes, max_offset, min_one)
        region = log.read_region(offset, max_bytes, max_offset, min_one)
        if not want:
            assert region is None, (offset, max_bytes, max_offset, min_one)
            continue
        assert region is not None and len(region) == len(want)
        last = [e for e in scan_entries(want)][-1]
        assert region.end_offset == last.last_offset + 1
        assert region.read() == want and region.fd == -1
        n += 1
    assert n > 1000


def test_reads_over_compaction_gaps(tmp_path):
    # offsets a cleaner left: batches whose offsets skip (written with explicit base offsets)
    log = PartitionLog.open(tmp_path / "g", LogConfig(index_interval_bytes=200), NOW)
    seg = log.segments[-1]
    offset = 0
    for i in range(30):
        b = bytearray(encode_batch([Record(j, NOW, None, b"v" * (10 + 40 * (i % 5)), []) for j in range(3)]))
        b[0:8] = offset.to_bytes(8, "big")
        os.pwrite(seg.fd, b, seg.size)
        seg.size += len(b)
        offset += 3 + (i % 4) * 5   # a gap after most batches
    seg.load_or_rebuild(200, validate=True)
    log.durable_end_offset = log.log_end_offset
    for start in range(0, log.log_end_offset):
        for max_bytes in (1, 150, 700, 5000):
            for max_offset in (None, start + 2, start + 12):
                want = reference_read(log, start, max_bytes, max_offset, True)
                assert log.read(start, max_bytes, max_offset) == want, (start, max_bytes, max_offset)
    log.close()


def test_a_region_outlives_its_segment(tmp_path):
    log = PartitionLog.open(tmp_path / "r", LogConfig(segment_bytes=2000), NOW)
    for i in range(20):
        log.append(bytearray(encode_batch([Record(0, NOW, None, b"%d" % i * 100, [])])), NOW)
    log.durable_end_offset = log.log_end_offset
    want = log.read(0, 1 << 20)
    region = log.read_region(0, 1 << 20)
    assert region is not None
    log.delete_records_before(log.log_end_offset - 1)   # retention took the first segment
    assert log.log_start_offset > 0 and not (tmp_path / "r" / f"{0:020d}.log").exists()
    assert region.read() == want
    log.close()
