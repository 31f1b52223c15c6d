"""ListOffsets by time on real log files: the first RECORD whose timestamp is at or after the target
(not the first batch holding one), inside compressed batches too, with LogAppendTime, v1 message
sets, a log start inside a batch, several segments and restarts; the largest timestamp's record
(MAX_TIMESTAMP); and a search that reads about one index interval, not the segment."""
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.tiers import examples

from oncelog.protocol.compression import CODEC_NAMES, GZIP, compress
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.records import HEADER_ROOM, Record, encode_batch, encode_legacy_message, seal_batch
from oncelog.storage.log import LogConfig, PartitionLog

NOW = 1_700_000_000_000
CODECS = sorted(CODEC_NAMES.items(), key=lambda kv: kv[1])


def open_log(path, **cfg):
    return PartitionLog.open(path, LogConfig(**cfg), NOW)


def batch_of(timestamps, codec=0, value=b"v"):
    return encode_batch([Record(i, ts, None, value + b"-%d" % i, []) for i, ts in enumerate(timestamps)],
                        compression=codec)


def first_at_or_after(records, target, start=0):
    """The model: records are (offset, timestamp) in offset order."""
    for offset, ts in records:
        if ts >= target and offset >= start:
            return offset, ts
    return None


def answer(log, target):
    found = log.offset_for_timestamp(target)
    return None if found is None else tuple(found[:2])


@pytest.mark.parametrize("codec_name,codec", CODECS)
def test_the_first_record_at_or_after_the_time_inside_one_batch(tmp_path, codec_name, codec):
    # librdkafka 0054: timestamps 1234 and 999999999999 in one batch; out-of-order times as well
    times = [1234, 999_999_999_999, 5000, 3000, 999_999_999_999, 4000]
    log = open_log(tmp_path / "p")
    log.append(batch_of(times, codec), NOW)
    records = list(enumerate(times))
    for target in sorted({0, *times, *(t - 1 for t in times), *(t + 1 for t in times)}):
        assert answer(log, target) == first_at_or_after(records, target), (codec_name, target)
    assert answer(log, 1235) == (1, 999_999_999_999)
    assert answer(log, 999_999_999_999) == (1, 999_999_999_999)
    assert log.offset_of_max_timestamp()[:2] == (1, 999_999_999_999)


def test_log_append_time_batches_answer_their_first_record(tmp_path):
    log = open_log(tmp_path / "p", message_timestamp_type="LogAppendTime")
    log.append(batch_of([10, 20, 30]), NOW)
    log.append(batch_of([40, 50]), NOW + 7)
    assert answer(log, 25) == (0, NOW)
    assert answer(log, NOW + 1) == (3, NOW + 7)
    assert answer(log, NOW + 8) is None
    assert log.offset_of_max_timestamp()[:2] == (3, NOW + 7)


def test_v1_messages_plain_and_in_a_compressed_wrapper(tmp_path):
    log = open_log(tmp_path / "p", message_format_version="0.10.2")
    plain = b"".join(encode_legacy_message(0, None, b"p%d" % i, timestamp=100 + i) for i in range(3))
    log.append(plain, NOW)  # offsets 0..2, times 100..102
    inner = b"".join(encode_legacy_message(i, None, b"w%d" % i, timestamp=t)
                     for i, t in enumerate([300, 200, 400]))
    wrapper = encode_legacy_message(0, None, compress(GZIP, inner), timestamp=400, compression_codec=GZIP)
    log.append(wrapper, NOW)  # offsets 3..5, times 300, 200, 400
    assert answer(log, 101) == (1, 101)
    assert answer(log, 150) == (3, 300)
    assert answer(log, 301) == (5, 400)
    assert answer(log, 401) is None
    assert log.offset_of_max_timestamp()[:2] == (5, 400)


def test_a_log_start_inside_a_batch_is_never_answered_below(tmp_path):
    log = open_log(tmp_path / "p")
    log.append(batch_of([100, 200, 300, 400]), NOW)
    log.delete_records_before(2)
    assert answer(log, 50) == (2, 300)
    assert answer(log, 350) == (3, 400)


def test_segments_restarts_and_the_leader_epoch_of_the_batch(tmp_path):
    log = open_log(tmp_path / "p", segment_bytes=400, index_interval_bytes=120)
    records = []
    for b in range(12):
        times = [NOW + 1000 * b + 37 * i for i in range(4)]
        log.leader_epoch = b // 4
        info = log.append(batch_of(times), NOW)
        records += [(info.first_offset + i, t) for i, t in enumerate(times)]
    assert len(log.segments) > 3
    log.close()
    log = open_log(tmp_path / "p", segment_bytes=400, index_interval_bytes=120)
    for target in (NOW, NOW + 38, NOW + 5000, NOW + 5075, NOW + 11_111, NOW + 11_112):
        assert answer(log, target) == first_at_or_after(records, target)
    assert log.offset_for_timestamp(NOW + 9_050).leader_epoch == 2


def test_the_search_reads_about_one_index_interval_not_the_segment(tmp_path, monkeypatch):
    log = open_log(tmp_path / "p", index_interval_bytes=4096)
    for b in range(3000):
        log.append(batch_of([NOW + 10 * b + i for i in range(5)], value=b"x" * 40), NOW)
    assert len(log.segments) == 1 and log.segments[0].size > 900_000
    read = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, pos: read.append(n) or real(fd, n, pos))
    assert answer(log, NOW + 10 * 2222 + 3) == (5 * 2222 + 3, NOW + 10 * 2222 + 3)
    assert sum(read) < 2 * 4096 + 1000, read


def test_a_batch_that_does_not_decompress_is_a_corrupt_message_not_a_crash(tmp_path):
    # the broker stores compressed records without reading them: only the search meets the damage
    log = open_log(tmp_path / "p")
    log.append(batch_of([10, 20]), NOW)
    log.append(seal_batch(bytearray(HEADER_ROOM + b"not zstd at all"), 2, base_timestamp=30,
                          max_timestamp=40, attributes=4), NOW)
    assert answer(log, 15) == (1, 20)
    with pytest.raises(KafkaProtocolError) as e:
        log.offset_for_timestamp(35)
    assert e.value.code == ErrorCode.CORRUPT_MESSAGE


@settings(max_examples=examples(60), deadline=None)
@given(batches=st.lists(st.tuples(st.lists(st.integers(0, 60), min_size=1, max_size=6),
                                  st.sampled_from([c for _n, c in CODECS])), min_size=1, max_size=14),
       segment_bytes=st.sampled_from([200, 500, 1 << 20]), interval=st.sampled_from([1, 150, 4096]),
       start=st.integers(0, 40), reopen=st.booleans(), targets=st.lists(st.integers(-1, 62), max_size=8))
def test_offsets_by_time_match_a_model(tmp_path_factory, batches, segment_bytes, interval, start, reopen,
                                       targets):
    path = tmp_path_factory.mktemp("t") / "p"
    log = open_log(path, segment_bytes=segment_bytes, index_interval_bytes=interval)
    records = []
    for times, codec in batches:
        info = log.append(batch_of(times, codec), NOW)
        records += [(info.first_offset + i, t) for i, t in enumerate(times)]
    start = min(start, log.log_end_offset)
    log.delete_records_before(start)
    if reopen:
        log.close()
        log = open_log(path, segment_bytes=segment_bytes, index_interval_bytes=interval)
    start = log.log_start_offset
    for target in targets:
        assert answer(log, target) == first_at_or_after(records, target, start), target
    live = [(o, t) for o, t in records if o >= start]
    largest = max((t for _o, t in live), default=-1)
    expected = first_at_or_after(live, largest) if largest >= 0 else None
    got = log.offset_of_max_timestamp()
    assert (got[:2] if got else None) == expected
