"""Header-level batch validation: what the produce path relies on instead of decoding records."""
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncelog.core.sequence import last_sequence_of
from oncelog.protocol import records
from oncelog.protocol.compression import compress
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.records import Record, decode_batch, encode_batch, encode_legacy_message


def _batch(n=3, **kw) -> bytearray:
    recs = [Record(i, 1000 + i, b"k%d" % i, b"v%d" % i) for i in range(n)]
    return bytearray(encode_batch(recs, **kw))


def test_header_fields_and_validation():
    buf = _batch(4, producer_id=7, producer_epoch=2, base_sequence=2**31 - 2)
    h = records.validate_batch(buf)
    assert (h.magic, h.records_count, h.last_offset_delta) == (2, 4, 3)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (7, 2, 2**31 - 2)
    assert last_sequence_of(h) == 1  # wraps past 2^31-1
    assert h.size == len(buf) and h.has_producer_id and not h.is_transactional


def test_patch_keeps_crc_valid_and_readers_see_new_offset():
    buf = _batch(3)
    records.patch_batch(buf, 0, 1234, 9)
    h = records.validate_batch(buf)
    assert (h.base_offset, h.partition_leader_epoch) == (1234, 9)
    assert [r.offset for r in decode_batch(bytes(buf))] == [1234, 1235, 1236]


def test_flipped_byte_is_corrupt_message():
    buf = _batch(3)
    buf[-1] ^= 0xFF
    with pytest.raises(KafkaProtocolError) as e:
        records.validate_batch(buf)
    assert e.value.code == ErrorCode.CORRUPT_MESSAGE


def test_count_disagreeing_with_offsets_is_invalid_record():
    buf = _batch(3)
    struct.pack_into(">i", buf, 57, 5)  # recordsCount
    with pytest.raises(KafkaProtocolError) as e:
        records.validate_batch(buf)
    assert e.value.code == ErrorCode.INVALID_RECORD


def test_record_set_must_cover_buffer_exactly():
    one, two = _batch(2), _batch(3)
    assert len(records.validate_record_set(one + two)) == 2
    with pytest.raises(KafkaProtocolError) as e:
        records.validate_record_set(one + two[:-5])
    assert e.value.code == ErrorCode.CORRUPT_MESSAGE


def test_iter_batches_stops_before_torn_tail():
    one, two = _batch(2), _batch(3)
    found = list(records.iter_batches(one + two[:40]))
    assert [pos for pos, _ in found] == [0]


def test_legacy_sets_validate_and_take_offsets():
    plain = b"".join(encode_legacy_message(0, None, b"x%d" % i, magic=1, timestamp=5 + i) for i in range(3))
    info = records.validate_legacy_message_set(plain)
    assert info == records.LegacySetInfo(1, 3, 7)
    buf = bytearray(plain)
    assert records.patch_legacy_offsets(buf, 100) == 102
    assert [m.base_offset for _pos, m in records.iter_batches(buf)] == [100, 101, 102]

    inner = b"".join(encode_legacy_message(i, None, b"y", magic=1, timestamp=1) for i in range(4))
    wrapper = bytearray(encode_legacy_message(0, None, compress(1, inner), magic=1, timestamp=1,
                                              compression_codec=1))
    assert records.validate_legacy_message_set(wrapper).message_count == 4
    assert records.patch_legacy_offsets(wrapper, 10) == 13
    assert next(records.iter_batches(wrapper))[1].base_offset == 13


def test_legacy_crc_mismatch_is_corrupt():
    buf = bytearray(encode_legacy_message(0, b"k", b"v", magic=0))
    buf[-1] ^= 1
    with pytest.raises(KafkaProtocolError) as e:
        records.validate_legacy_message_set(buf)
    assert e.value.code == ErrorCode.CORRUPT_MESSAGE


def _one_batch(buf):
    [(header, recs)] = list(records.iter_record_batches(buf))
    return header, recs


def _wrapper(magic, inner, codec=1, **kw):
    return encode_legacy_message(0, None, compress(codec, inner), magic=magic, compression_codec=codec, **kw)


def test_upconverted_legacy_sets_are_one_v2_batch_with_kafkas_timestamps():
    v0 = b"".join(encode_legacy_message(7, b"k%d" % i, b"v%d" % i, magic=0) for i in range(3))
    batch = records.upconvert_legacy_message_set(v0, None)
    header, recs = _one_batch(batch)
    assert (header.magic, header.producer_id, header.compression, header.records_count) == (2, -1, 0, 3)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in recs] == [
        (i, -1, b"k%d" % i, b"v%d" % i) for i in range(3)]
    # a magic-0 wrapper (absolute inner offsets) is accepted: every offset is reassigned
    header, recs = _one_batch(records.upconvert_legacy_message_set(_wrapper(0, v0), None))
    assert (header.compression, [r.value for r in recs]) == (1, [b"v0", b"v1", b"v2"])
    # magic 1 keeps its timestamps, or takes its LogAppendTime wrapper's; the topic's codec wins
    v1 = b"".join(encode_legacy_message(i, None, b"x", magic=1, timestamp=100 + i) for i in range(2))
    header, recs = _one_batch(records.upconvert_legacy_message_set(_wrapper(1, v1, timestamp=101), 0))
    assert (header.compression, [r.timestamp for r in recs], header.max_timestamp) == (0, [100, 101], 101)
    stamped = _wrapper(1, v1, timestamp=555, timestamp_type=1)
    assert [r.timestamp for r in _one_batch(records.upconvert_legacy_message_set(stamped, None))[1]] == [555, 555]


@pytest.mark.parametrize("bad, code", [
    (_wrapper(1, encode_legacy_message(0, None, b"x", magic=1)) * 2, ErrorCode.INVALID_RECORD),  # two wrappers
    (_wrapper(1, _wrapper(1, encode_legacy_message(0, None, b"x", magic=1))), ErrorCode.INVALID_RECORD),  # nested
    (_wrapper(1, encode_legacy_message(0, None, b"x", magic=0)), ErrorCode.INVALID_RECORD),  # inner magic differs
    (_wrapper(1, b""), ErrorCode.INVALID_RECORD),  # holds nothing
    (encode_legacy_message(0, None, b"x", magic=0) + encode_legacy_message(0, None, b"y", magic=1),
     ErrorCode.INVALID_RECORD),
    (encode_legacy_message(0, None, b"not gzip", magic=1, compression_codec=1), ErrorCode.CORRUPT_MESSAGE),
    (encode_legacy_message(0, b"k", b"v", magic=0)[:-1] + b"w", ErrorCode.CORRUPT_MESSAGE),  # CRC
])
def test_bad_legacy_sets_are_refused_before_upconversion(bad, code):
    with pytest.raises(KafkaProtocolError) as e:
        records.upconvert_legacy_message_set(bytearray(bad), None)
    assert e.value.code == code


@given(st.binary(max_size=200))
def test_random_bytes_never_escape_as_other_exceptions(data):
    for fn in (records.validate_record_set, records.validate_legacy_message_set,
               lambda b: records.upconvert_legacy_message_set(b, None)):
        try:
            fn(bytearray(data))
        except KafkaProtocolError as e:
            assert e.code in (ErrorCode.CORRUPT_MESSAGE, ErrorCode.INVALID_RECORD)


@pytest.mark.parametrize("value, magic", [
    (None, 2), ("0.8.2", 0), ("0.9.0.1", 0), ("0.10", 1), ("0.10.2-IV0", 1), ("0.11.0", 2), ("1.0", 2),
    ("2.8", 2), ("3.0-IV1", 2), ("3.0", 2), ("v0", 0), ("v1", 1), ("2", 2), (1, 1)])
def test_message_format_version_to_magic(value, magic):
    assert records.parse_message_format_version(value) == magic == records.message_format_magic(value)


@pytest.mark.parametrize("value", ["", "x", "0.x", "3.x", "latest"])
def test_message_format_version_that_does_not_parse(value):
    """Refused where it is set (CreateTopics, IncrementalAlterConfigs), read as the current
    format where it arrives from elsewhere (a stored override, a foreign broker's answer)."""
    from oncelog.core.topic_config import TOPIC_CONFIGS, ConfigError
    with pytest.raises(ConfigError):
        TOPIC_CONFIGS["message.format.version"].parse(value)
    assert records.message_format_magic(value) == 2


def test_writable_patches_a_writable_view_in_place_and_copies_anything_else():
    frame = bytearray(b"\x00" * 70)
    view = memoryview(frame)[3:]
    assert records.writable(view) is view
    assert records.writable(frame) is frame
    ro = memoryview(bytes(70))
    copy = records.writable(ro)
    assert isinstance(copy, bytearray) and copy == ro
    records.patch_batch(records.writable(view), 0, 42, 7)
    assert int.from_bytes(frame[3:11], "big") == 42  # the frame itself carries the offset


@pytest.mark.parametrize("source", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("target", [0, 1, 2, 3, 4])
def test_recompress_keeps_every_header_field_and_record(source, target):
    """A topic's compression.type: each batch's records under the topic's codec, the producer's
    id, epoch, sequence, timestamps and transactional flag as they came (Kafka's LogValidator)."""
    first = _batch(5, compression=source, producer_id=9, producer_epoch=3, base_sequence=40, transactional=True)
    second = _batch(2, compression=source)
    buf = first + second
    headers = records.validate_record_set(buf)
    out = records.recompress(buf, headers, target)
    after = records.validate_record_set(out)  # lengths and CRCs are right
    assert [h.compression for h in after] == [target, target]
    keep = lambda h: h._replace(batch_length=0, crc=0, attributes=h.attributes & ~7)  # noqa: E731
    assert [keep(h) for h in after] == [keep(h) for h in headers]
    assert decode_batch(bytes(out[:after[0].size])) == decode_batch(bytes(first))
    assert decode_batch(bytes(out[after[0].size:])) == decode_batch(bytes(second))


def test_recompress_refuses_a_batch_that_does_not_decompress():
    buf = _batch(3, compression=1)
    buf[records.BATCH_OVERHEAD] ^= 0xFF  # the gzip magic
    with pytest.raises(KafkaProtocolError) as e:
        records.recompress(buf, [records.read_batch_header(buf)], 4)
    assert e.value.code == ErrorCode.CORRUPT_MESSAGE
