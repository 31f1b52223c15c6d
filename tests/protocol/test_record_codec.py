"""Record batch v2 / v0 / v1 codec against kafka-python's independent implementation."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from tests.tiers import examples

from oncelog.protocol import compression
from oncelog.protocol.errors import KafkaProtocolError
from oncelog.protocol.records import (
    Record,
    decode_batch,
    decode_records,
    decode_varint,
    encode_batch,
    encode_varint,
    iter_record_batches,
    rewrite_producer_state,
)

CODECS = [0, 1, 2, 3, 4]

records_st = st.lists(
    st.tuples(st.integers(0, 2**41), st.none() | st.binary(max_size=40), st.none() | st.binary(max_size=300),
              st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3)),
    min_size=1, max_size=20)


@given(st.integers(-2**63, 2**63 - 1))
def test_varint_roundtrip(n):
    b = encode_varint(n)
    assert decode_varint(b, 0) == (n, len(b))


@settings(max_examples=examples(60), deadline=None)
@given(records_st, st.sampled_from(CODECS))
def test_roundtrip_and_kafka_python_reads_ours(recs, codec):
    records = [Record(i, ts, k, v, tuple(h)) for i, (ts, k, v, h) in enumerate(recs)]
    buf = encode_batch(records, base_offset=100, compression=codec, producer_id=7, producer_epoch=3,
                       base_sequence=42)
    out = decode_batch(buf)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in out] == \
        [(100 + i, ts, k, v, tuple(h)) for i, (ts, k, v, h) in enumerate(recs)]
    if codec not in (0, 1):
        return  # kafka-python here has no snappy/lz4/zstd libraries; our own round trip covers them
    theirs = DefaultRecordBatch(bytearray(buf))
    assert theirs.validate_crc()
    assert theirs.producer_id == 7 and theirs.producer_epoch == 3 and theirs.base_sequence == 42
    assert [(r.offset, r.key, r.value) for r in theirs] == [(100 + i, k, v) for i, (_, k, v, _h) in enumerate(recs)]


@pytest.mark.parametrize("codec", [0, 1])
def test_we_read_kafka_python_batches(codec):
    b = DefaultRecordBatchBuilder(2, codec, False, 5, 1, 10, 1 << 20)
    for i in range(50):
        b.append(i, 1_700_000_000_000 + i, b"k%d" % i, b"v" * i, [("h", b"x")])
    buf = bytes(b.build())
    out = decode_batch(buf)
    assert [r.value for r in out] == [b"v" * i for i in range(50)]
    assert out[3].headers == (("h", b"x"),)
    assert out[49].timestamp == 1_700_000_000_049


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", [0, 1])
def test_legacy_message_sets(magic, codec):
    b = LegacyRecordBatchBuilder(magic, codec, 1 << 20)
    for i in range(10):
        b.append(i, 1_600_000_000_000 + i if magic else None, b"k", b"v%d" % i)
    buf = bytearray(b.build())
    if codec and magic == 1:
        buf[0:8] = (9).to_bytes(8, "big")  # a broker stamps the wrapper with the last inner offset
    out = decode_records(bytes(buf))
    assert [r.value for r in out] == [b"v%d" % i for i in range(10)]
    assert [r.offset for r in out] == list(range(10))
    if magic == 1:
        assert out[4].timestamp == 1_600_000_000_004


def test_crc_mismatch_is_corrupt_message():
    buf = bytearray(encode_batch([Record(0, 1, b"k", b"v")]))
    buf[-1] ^= 0xFF
    with pytest.raises(KafkaProtocolError) as e:
        decode_batch(buf)
    assert e.value.code.name == "CORRUPT_MESSAGE"


def test_truncated_tail_is_skipped():
    a = encode_batch([Record(0, 1, None, b"a")])
    b = encode_batch([Record(0, 1, None, b"b")], base_offset=1)
    assert [r.value for r in decode_records(a + b[:-3])] == [b"a"]


def test_rewrite_producer_state_keeps_records_and_valid_crc():
    buf = encode_batch([Record(0, 5, b"k", b"v"), Record(1, 6, None, b"w")], producer_id=1, producer_epoch=0,
                       base_sequence=10)
    new = rewrite_producer_state(buf, 1, 1, 0)
    info, recs = next(iter_record_batches(new))
    assert (info.producer_id, info.producer_epoch, info.base_sequence) == (1, 1, 0)
    assert [r.value for r in recs] == [b"v", b"w"]


def test_snappy_xerial_framing_accepted_on_read():
    data = b"hello world " * 10000
    assert compression.decompress(2, compression.xerial_frame(data)) == data
    assert compression.decompress(2, compression.compress(2, data)) == data


def test_codec_names():
    assert compression.codec_for_name("zstd") == 4
    with pytest.raises(ValueError, match="compression.type"):
        compression.codec_for_name("brotli")
