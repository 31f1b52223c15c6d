"""PartitionLog and LogManager over real files: offsets, reads, rolls, retention, DeleteRecords,
recovery of torn and corrupt tails, index rebuilds, failed writes, legacy message sets."""
import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.tiers import examples

from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.records import Record, decode_records, encode_batch, encode_legacy_message
from oncelog.storage import failpoints
from oncelog.storage.log import LogConfig, PartitionLog
from oncelog.storage.log_manager import LogManager

NOW = 1_700_000_000_000


def batch(n=3, tag=b"v", ts=NOW):
    return encode_batch([Record(i, ts, None, tag + b"-%d" % i, []) for i in range(n)])


def values(data):
    return [r.value for r in decode_records(data)]


def read_all(log, offset):
    """Reads stop at a segment's end, as Kafka's do: follow them to the log end."""
    out = []
    while offset < log.log_end_offset:
        recs = [r for r in decode_records(log.read(offset, 1 << 20)) if r.offset >= offset]
        out += recs
        offset = recs[-1].offset + 1
    return out


def open_log(tmp_path, **cfg):
    return PartitionLog.open(tmp_path / "p", LogConfig(**cfg), NOW)


def test_offsets_are_assigned_and_read_back(tmp_path):
    log = open_log(tmp_path)
    infos = [log.append(batch(3, b"a%d" % i), NOW) for i in range(4)]
    assert [(i.first_offset, i.last_offset) for i in infos] == [(0, 2), (3, 5), (6, 8), (9, 11)]
    assert log.log_end_offset == 12
    data = log.read(7, 1 << 20)
    recs = decode_records(data)
    assert recs[0].offset == 6 and recs[-1].offset == 11  # from the batch holding offset 7
    assert log.read(12, 100) == b""
    with pytest.raises(KafkaProtocolError) as e:
        log.read(13, 100)
    assert e.value.code == ErrorCode.OFFSET_OUT_OF_RANGE


def test_read_returns_at_least_one_whole_batch_and_never_a_partial_one(tmp_path):
    log = open_log(tmp_path)
    for _i in range(5):
        log.append(batch(10, b"x" * 50), NOW)
    one = log.read(0, 10)
    assert [r.offset for r in decode_records(one)] == list(range(10))
    two = log.read(0, len(one) * 2 + 5)
    assert len(decode_records(two)) == 20


def test_read_without_min_one_returns_nothing_when_the_first_batch_does_not_fit(tmp_path):
    # Fetch's later partitions (KIP-74): only the first partition with data may exceed the limit
    log = open_log(tmp_path)
    for _i in range(3):
        log.append(batch(10, b"x" * 50), NOW)
    one = bytes(log.read(0, 10))
    assert log.read(0, 10, min_one=False) == b""
    assert bytes(log.read(0, len(one), min_one=False)) == one
    assert len(decode_records(log.read(0, 2 * len(one) + 1, min_one=False))) == 20


def test_roll_by_size_and_by_age_and_read_across_segments(tmp_path):
    log = open_log(tmp_path, segment_bytes=400, segment_ms=1000)
    rolled = []
    log.on_roll(rolled.append)
    for i in range(6):
        log.append(batch(3, b"s%d" % i), NOW)
    assert len(log.segments) > 1 and rolled
    before = len(log.segments)
    log.append(batch(1), NOW + 5000)  # older than segment.ms: a new segment
    assert len(log.segments) == before + 1
    assert [r.offset for r in read_all(log, 0)] == list(range(log.log_end_offset))
    assert sorted(p.name for p in (tmp_path / "p").glob("*.log"))[0] == "00000000000000000000.log"


def test_retention_by_size_and_time_advances_the_log_start(tmp_path):
    log = open_log(tmp_path, segment_bytes=300)
    deleted = []
    log.on_segments_deleted(deleted.append)
    for i in range(8):
        log.append(batch(2, ts=NOW + i), NOW)
    log.config.retention_bytes = 300
    assert log.enforce_retention(NOW) > 0
    assert log.log_start_offset > 0 and deleted[-1] == log.log_start_offset
    assert log.size_bytes - log.segments[0].size < 300  # Kafka's rule: drop while the rest is enough
    log.config.retention_bytes = -1
    log.config.retention_ms = 10
    log.enforce_retention(NOW + 1000)
    assert len(log.segments) == 1  # never the active segment
    start = log.log_start_offset
    log.close()
    assert PartitionLog.open(tmp_path / "p", LogConfig(), NOW).log_start_offset == start


def test_delete_records_moves_the_start_and_survives_restart(tmp_path):
    log = open_log(tmp_path, segment_bytes=300)
    for _i in range(6):
        log.append(batch(2), NOW)
    log.delete_records_before(5)
    assert log.log_start_offset == 5
    with pytest.raises(KafkaProtocolError):
        log.read(4, 100)
    assert read_all(log, 5)[-1].offset == 11
    with pytest.raises(KafkaProtocolError):
        log.delete_records_before(99)
    log.close()
    again = PartitionLog.open(tmp_path / "p", LogConfig(), NOW)
    assert (again.log_start_offset, again.log_end_offset) == (5, 12)


@pytest.mark.parametrize("damage", ["torn", "crc"])
def test_recovery_cuts_a_torn_or_corrupt_tail_and_keeps_the_rest(tmp_path, damage, caplog):
    log = open_log(tmp_path)
    for i in range(3):
        log.append(batch(2, b"k%d" % i), NOW)
    path = log.segments[-1].path
    good = path.stat().st_size
    # no close: as after kill -9
    with open(path, "ab") as f:
        tail = bytearray(batch(2, b"bad"))
        if damage == "torn":
            f.write(tail[:len(tail) // 2])
        else:
            tail[-1] ^= 0xFF
            struct.pack_into(">q", tail, 0, 6)
            f.write(tail)
    again = PartitionLog.open(tmp_path / "p", LogConfig(), NOW)
    assert path.stat().st_size == good
    assert again.log_end_offset == 6
    assert "truncating" in caplog.text
    assert values(again.read(0, 1 << 20)) == [b"k0-0", b"k0-1", b"k1-0", b"k1-1", b"k2-0", b"k2-1"]
    assert again.append(batch(1), NOW).first_offset == 6


def test_clean_restart_keeps_everything_and_skips_the_scan(tmp_path):
    log = open_log(tmp_path, segment_bytes=500)
    for i in range(10):
        log.append(batch(2, b"c%d" % i), NOW)
    log.close()
    assert (tmp_path / "p" / ".clean-shutdown").exists()
    again = PartitionLog.open(tmp_path / "p", LogConfig(segment_bytes=500), NOW)
    assert not (tmp_path / "p" / ".clean-shutdown").exists()
    assert again.log_end_offset == 20
    assert [r.value for r in read_all(again, 0)][-2:] == [b"c9-0", b"c9-1"]


def test_a_missing_index_is_rebuilt(tmp_path):
    log = open_log(tmp_path, segment_bytes=300, index_interval_bytes=1)
    for i in range(6):
        log.append(batch(2, b"i%d" % i), NOW)
    log.close()
    for p in (tmp_path / "p").glob("*.index"):
        p.unlink()
    again = PartitionLog.open(tmp_path / "p", LogConfig(index_interval_bytes=1), NOW)
    assert values(again.read(9, 1 << 20))[:2] == [b"i4-0", b"i4-1"]


@pytest.mark.parametrize("fault", ["shortwrite", "enospc"])
def test_a_failed_write_appends_nothing_and_the_log_recovers(tmp_path, fault):
    log = open_log(tmp_path)
    log.append(batch(2, b"ok"), NOW)
    size = log.segments[-1].size
    failpoints.configure(f"{fault}:log")  # a short write leaves half the batch in the file
    try:
        with pytest.raises(KafkaProtocolError) as e:
            log.append(batch(2, b"lost"), NOW)
    finally:
        failpoints.configure(None)
    assert e.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert log.log_end_offset == 2 and os.path.getsize(log.segments[-1].path) == size
    assert log.append(batch(2, b"again"), NOW).first_offset == 2
    assert values(log.read(0, 1 << 20)) == [b"ok-0", b"ok-1", b"again-0", b"again-1"]


def test_legacy_message_sets_get_offsets_and_read_back(tmp_path):
    log = open_log(tmp_path)
    msgs = b"".join(encode_legacy_message(0, None, b"m%d" % i, magic=1, timestamp=NOW) for i in range(3))
    info = log.append(msgs, NOW)
    assert (info.first_offset, info.last_offset) == (0, 2)
    log.append(batch(2), NOW)
    assert [r.offset for r in decode_records(log.read(0, 1 << 20))] == [0, 1, 2, 3, 4]


def test_offset_for_timestamp(tmp_path):
    log = open_log(tmp_path)
    for i in range(5):
        log.append(batch(2, ts=NOW + 1000 * i), NOW)
    assert log.offset_for_timestamp(NOW + 2500)[:2] == (6, NOW + 3000)
    assert log.offset_for_timestamp(NOW + 99_999) is None


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.one_of(st.integers(1, 5), st.just("reopen"), st.just("crash")), max_size=25))
def test_random_appends_and_restarts_match_a_model(tmp_path_factory, ops):
    d = tmp_path_factory.mktemp("h")
    cfg = LogConfig(segment_bytes=350)
    log = PartitionLog.open(d, cfg, NOW)
    model = []
    for op in ops:
        if op == "reopen":
            log.close()
            log = PartitionLog.open(d, cfg, NOW)
        elif op == "crash":
            for s in log.segments:
                s.close()
            log = PartitionLog.open(d, cfg, NOW)
        else:
            vals = [b"%d" % (len(model) + i) for i in range(op)]
            log.append(encode_batch([Record(i, NOW, None, v, []) for i, v in enumerate(vals)]), NOW)
            model += vals
        assert log.log_end_offset == len(model)
        assert [r.value for r in read_all(log, 0)] == model
    log.close()


async def test_log_manager_topics_survive_restart_and_refuse_bad_input(tmp_path):
    lm = LogManager([str(tmp_path / "a"), str(tmp_path / "b")], {"segment.bytes": 1000})
    await lm.open(NOW)
    info = await lm.create_topic("orders", 3, {"retention.ms": "1000"}, NOW)
    await lm.create_topic("other", 1, {}, NOW)
    for bad, code in [("bad name!", ErrorCode.INVALID_TOPIC_EXCEPTION), ("..", ErrorCode.INVALID_TOPIC_EXCEPTION),
                      ("orders", ErrorCode.TOPIC_ALREADY_EXISTS)]:
        with pytest.raises(KafkaProtocolError) as e:
            await lm.create_topic(bad, 1, {}, NOW)
        assert e.value.code == code
    with pytest.raises(KafkaProtocolError) as e:
        await lm.create_topic("cfg", 1, {"retention.ms": "soon"}, NOW)
    assert e.value.code == ErrorCode.INVALID_CONFIG
    assert "cfg" not in lm.topics
    lm.get_partition("orders", 1).append_from_client(bytearray(batch(2)), NOW)
    await lm.alter_topic_config("orders", {"producer.state.batches.to.retain": "20"}, ["retention.ms"])
    assert lm.get_partition("orders", 0).producer_state_batches_to_retain == 20
    await lm.close()
    again = LogManager([str(tmp_path / "a"), str(tmp_path / "b")], {})
    await again.open(NOW)
    assert again.topics["orders"].topic_id == info.topic_id
    assert again.topics["orders"].overrides == {"producer.state.batches.to.retain": "20"}
    assert again.get_partition("orders", 1).log_end_offset == 2
    assert {again.topics["orders"].log_dir, again.topics["other"].log_dir} == {str(tmp_path / "a"), str(tmp_path / "b")}
    await again.delete_topic("orders")
    assert not any((tmp_path / "a").glob("orders-*")) and not any((tmp_path / "b").glob("orders-*"))
    await again.close()
