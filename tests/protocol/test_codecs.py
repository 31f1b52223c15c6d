"""The broker's hand-written codecs against two independent readers: oncelog's client codec and
kio's generated entities (Kafka's own schemas)."""
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.tiers import examples

from oncelog.protocol import entities, fetch, framing, headers, metadata, produce
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import error_code
from oncelog.protocol.primitives import Reader
from oncelog.protocol.records import Record, encode_batch

TID = uuid.UUID("12345678-1234-5678-1234-567812345678")


@pytest.mark.parametrize("version", range(3, 15))
def test_produce_request_written_by_the_client_reads_back(version):
    topic = TID if version >= 13 else "orders"
    body = produce.encode_request(version, -1, 3000, {topic: [(0, b"abc"), (3, b"defg")]})
    req = produce.decode_request(version, body)
    assert (req.acks, req.timeout_ms, req.transactional_id) == (-1, 3000, None)
    [(t, parts)] = req.topics
    assert t == topic
    assert [(i, bytes(r)) for i, r in parts] == [(0, b"abc"), (3, b"defg")]


@pytest.mark.parametrize("version", range(3, 15))
@pytest.mark.parametrize("range_mode", [False, True])
def test_produce_response_reads_back_in_the_client(version, range_mode):
    topic = TID if version >= 13 else "orders"
    resp = produce.TopicResponse(topic, [produce.PartitionResponse(2, 59, -1, -1, 17, "unknown producer")],
                                 batches_to_retain=20,
                                 max_in_flight_sequence_number=1000 if range_mode else None)
    body = produce.encode_response(version, [resp], throttle_ms=0)
    [t] = produce.decode_response(version, body)
    p = t.partitions[0]
    assert (p.index, p.error_code) == (2, 59)
    if version >= 5:
        assert p.log_start_offset == 17
    if version >= 14:
        assert t.batches_to_retain == 20
        assert t.max_in_flight_sequence_number == (1000 if range_mode else None)
    if version <= 13:
        # kio knows Kafka's schema up to v13: it must read our bytes too
        cls = entities.entity_class(ApiKey.PRODUCE, version, "response")
        from kio.serial import entity_reader
        decoded, _ = entity_reader(cls)(body, 0)
        assert decoded.responses[0].partition_responses[0].index == 2


@pytest.mark.parametrize("version", range(9, 15))
def test_produce_response_window_on_partitions_and_topics_reads_back(version):
    """v14: tag 1 on each existing partition and on the topic; none for a missing partition."""
    topic = TID if version >= 13 else "orders"
    resp = produce.TopicResponse(topic, [produce.PartitionResponse(0, 0, 5, -1, 0, batches_to_retain=20),
                                         produce.PartitionResponse(9, 3)], batches_to_retain=20)
    [t] = produce.decode_response(version, produce.encode_response(version, [resp]))
    present, missing = t.partitions
    expected = 20 if version >= 14 else None
    assert (present.batches_to_retain, present.topic_batches_to_retain) == (expected, expected)
    assert (missing.batches_to_retain, missing.topic_batches_to_retain) == (None, expected)
    assert present.base_offset == 5 and missing.error_code == 3


@pytest.mark.parametrize("version", range(1, 13))
@pytest.mark.parametrize("magic", [1, 2])
def test_metadata_response_reads_back_in_kio_and_the_client(version, magic):
    body = metadata.encode_response(
        version, [metadata.BrokerEntry(1, "127.0.0.1", 9092)], "cid", 1,
        [metadata.TopicEntry("orders", 0, TID, (metadata.PartitionEntry(0, 0, 1, 0),), magic),
         metadata.TopicEntry("missing", 3)])
    if magic == 2 or version < 9:
        # kio refuses unknown tags (real clients skip them, see tests/compat), so only without ours
        cls = entities.entity_class(ApiKey.METADATA, version, "response")
        from kio.serial import entity_reader
        decoded, size = entity_reader(cls)(body, 0)
        assert size == len(body)
        assert [t.name for t in decoded.topics] == ["orders", "missing"]
    info = metadata.decode_response(version, body)
    assert info.brokers[1].port == 9092
    assert info.topics["orders"].partitions[0].leader_id == 1
    expected = 1 if (magic == 1 and version >= 9) else None
    assert info.topics["orders"].message_format_magic == expected


@pytest.mark.parametrize("version", range(4, 13))
def test_fetch_response_reads_back_in_kio(version):
    body = fetch.encode_response(version, [("orders", [fetch.PartitionData(0, 0, 10, 2, b"\x00" * 70)])])
    cls = entities.entity_class(ApiKey.FETCH, version, "response")
    from kio.serial import entity_reader
    decoded, size = entity_reader(cls)(body, 0)
    assert size == len(body)
    part = decoded.responses[0].partitions[0]
    assert part.high_watermark == 10


def test_frames_split_anywhere_are_reassembled():
    frames = [b"a" * 5, b"", b"xyz" * 100]
    stream = b"".join(framing.frame([f]) for f in frames)
    dec = framing.FrameReader(1000)
    out = []
    for i in range(0, len(stream), 7):
        out += [bytes(f) for f in dec.feed(stream[i:i + 7])]
    assert out == frames


@given(st.integers(min_value=1001, max_value=2**31 - 1) | st.integers(max_value=-1, min_value=-2**31))
def test_oversized_or_negative_frame_is_refused_from_its_size_alone(size):
    dec = framing.FrameReader(1000)
    with pytest.raises(framing.FrameError):
        dec.feed(size.to_bytes(4, "big", signed=True))
    assert dec.buffered <= 4


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.integers(0, 3000) | st.integers(60_000, 2_500_000), min_size=1, max_size=6),
       st.sampled_from([16, 1000, 65536]), st.randoms(use_true_random=False))
def test_frames_read_into_the_readers_buffers_in_any_pieces(sizes, scratch, rnd):
    frames = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    stream = b"".join(framing.frame([f]) for f in frames)
    reader = framing.FrameReader(3_000_000, scratch_size=scratch)
    out, pos = [], 0
    while pos < len(stream):
        room = reader.get_buffer()
        n = min(len(room), rnd.randint(1, 300_000), len(stream) - pos)
        room[:n] = stream[pos:pos + n]
        del room
        got = reader.buffer_updated(n)
        assert all(not f.readonly for f in got)  # the broker patches a Produce's offsets in place
        out += [bytes(f) for f in got]
        pos += n
    assert out == frames
    assert reader.buffered == 0


def test_a_large_size_alone_reserves_no_more_than_a_megabyte():
    reader = framing.FrameReader(100 * 1024 * 1024)
    reader.feed((100 * 1024 * 1024).to_bytes(4, "big") + b"x" * 70_000)
    assert len(reader.get_buffer()) <= 1024 * 1024
    # a client trusts its broker's sizes: the whole response gets its buffer at once, no regrowth
    trusting = framing.FrameReader(100 * 1024 * 1024, first_big=100 * 1024 * 1024)
    trusting.feed((100 * 1024 * 1024).to_bytes(4, "big") + b"x" * 70_000)
    assert len(trusting.get_buffer()) == 100 * 1024 * 1024 - (70_000 - 0)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_request_header_of_api_versions(version):
    hdr = headers.request_header(18, version, 42, "me")
    h = headers.read_request_header(hdr)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id, h.body_offset) == (18, version, 42, "me", len(hdr))
    assert headers.response_header(18, version, 42) == (42).to_bytes(4, "big")


def test_truncated_header_is_a_clear_error():
    with pytest.raises(ValueError):
        headers.read_request_header(b"\x00\x12\x00")


def test_reader_refuses_a_string_longer_than_the_message():
    with pytest.raises(ValueError):
        Reader(b"\x00\x10ab").string(compact=False)


@pytest.mark.parametrize("version", range(4, 13))
def test_fetch_response_reads_back_with_an_unknown_code_on_one_partition(version):
    """A code newer than this version's list (9999) is its partition's error; the other partition
    of the response is read as usual. kio, which reads codes into its enum, fails the whole
    response: why the client reads Fetch with this codec."""
    records = encode_batch([Record(0, 1000, None, b"v")], base_offset=7)
    body = fetch.encode_response(version, [("orders", [fetch.PartitionData(0, 9999),
                                                       fetch.PartitionData(1, 0, 8, 2, records)])])
    r = fetch.decode_response(version, body)
    assert r.error_code == 0
    [(name, (bad, good))] = r.topics
    assert name == "orders" and (bad.index, bad.error_code, bytes(bad.records)) == (0, 9999, b"")
    assert error_code(bad.error_code).name == "UNKNOWN_ERROR_9999"
    assert (good.index, good.error_code, good.high_watermark, bytes(good.records)) == (1, 0, 8, records)
    if version >= 5:
        assert good.log_start_offset == 2
    with pytest.raises(entities.MalformedResponse):
        entities.decode_response(ApiKey.FETCH, version, body)
