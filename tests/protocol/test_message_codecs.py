"""The hand-written message codecs from the client's side (protocol/produce.py, metadata.py,
init_producer_id.py): Produce request v3-14, ProduceResponse v14 tags (KIP-1269 tag 1, range-mode
tag 10000), Metadata tag 10000; read from hand-built bytes, cross-checked with kio where kio knows
the version."""
import struct
import uuid

import pytest
from kio.serial import entity_reader

from oncelog.protocol import init_producer_id, metadata, produce
from oncelog.protocol.primitives import uvarint


def uv(n):
    return uvarint(n)


def cstr(s):
    b = s.encode()
    return uv(len(b) + 1) + b


def tagged(fields: dict) -> bytes:
    out = [uv(len(fields))]
    for tag, data in sorted(fields.items()):
        out += [uv(tag), uv(len(data)), data]
    return b"".join(out)


def produce_response_v14(topic_id, topic_tags, partition_tags=None):
    part = (struct.pack(">ihqqq", 0, 0, 42, -1, 7) + uv(1) + b"\x00" + tagged(partition_tags or {}))
    topic = topic_id.bytes + uv(2) + part + tagged(topic_tags)
    return uv(2) + topic + struct.pack(">i", 0) + tagged({})


def test_produce_response_v14_reads_batches_to_retain_and_range_threshold():
    tid = uuid.uuid4()
    body = produce_response_v14(tid, {1: struct.pack(">i", 20), 10000: struct.pack(">i", 1000000)})
    [t] = produce.decode_response(14, body)
    assert t.topic == tid and t.batches_to_retain == 20 and t.max_in_flight_sequence_number == 1000000
    assert t.partitions[0].base_offset == 42 and t.partitions[0].log_start_offset == 7


def test_produce_response_without_tags_means_old_broker():
    [t] = produce.decode_response(14, produce_response_v14(uuid.uuid4(), {}))
    assert t.batches_to_retain is None and t.max_in_flight_sequence_number is None


def test_tag_1_ignored_below_v14_and_unknown_tags_skipped():
    body = produce_response_v14(uuid.uuid4(), {1: struct.pack(">i", 20), 77: b"junk!"})
    [t] = produce.decode_response(13, body)
    assert t.batches_to_retain is None


def test_current_leader_tag_in_partition():
    lead = struct.pack(">ii", 3, 9) + b"\x00"
    [t] = produce.decode_response(14, produce_response_v14(uuid.uuid4(), {}, {0: lead}))
    assert (t.partitions[0].leader_id, t.partitions[0].leader_epoch) == (3, 9)


@pytest.mark.parametrize("version", [3, 8, 9, 12])
def test_produce_request_matches_kio(version):
    from importlib import import_module
    req_mod = import_module(f"kio.schema.produce.v{version}.request")
    body = produce.encode_request(version, -1, 30000, {"t": [(0, b"RECORDS"), (3, b"MORE")]})
    value, size = entity_reader(req_mod.ProduceRequest)(body, 0)
    assert size == len(body)
    assert value.acks == -1 and value.transactional_id is None
    [td] = value.topic_data
    assert td.name == "t"
    assert [(p.index, bytes(p.records)) for p in td.partition_data] == [(0, b"RECORDS"), (3, b"MORE")]


def test_produce_request_v13_uses_topic_id():
    from kio.schema.produce.v13.request import ProduceRequest
    tid = uuid.uuid4()
    body = produce.encode_request(14, 1, 1000, {tid: [(0, b"R")]})
    value, _ = entity_reader(ProduceRequest)(body, 0)
    assert value.topic_data[0].topic_id == tid


def metadata_topic_v12(name, tags):
    part = struct.pack(">hiii", 0, 0, 1, 5) + uv(2) + struct.pack(">i", 1) + uv(2) + \
        struct.pack(">i", 1) + uv(1) + b"\x00"
    return (struct.pack(">h", 0) + cstr(name) + uuid.uuid4().bytes + b"\x00" + uv(2) + part +
            struct.pack(">i", -2147483648) + tagged(tags))


def test_metadata_reads_message_format_version_tag():
    brokers = uv(2) + struct.pack(">i", 1) + cstr("h") + struct.pack(">i", 9092) + b"\x00" + b"\x00"
    body = (struct.pack(">i", 0) + brokers + cstr("c") + struct.pack(">i", 1) + uv(3) +
            metadata_topic_v12("old", {10000: b"\x01"}) + metadata_topic_v12("new", {}) + b"\x00")
    info = metadata.decode_response(12, body)
    assert info.brokers[1].port == 9092
    assert info.topics["old"].message_format_magic == 1
    assert info.topics["new"].message_format_magic is None
    assert info.topics["old"].partitions[0].leader_id == 1 and info.topics["old"].partitions[0].leader_epoch == 5


def test_init_producer_id_bump_request():
    from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
    value, _ = entity_reader(InitProducerIdRequest)(init_producer_id.encode_request(4, 77, 3), 0)
    assert value.transactional_id is None and value.producer_id == 77 and value.producer_epoch == 3


# KIP-1269's window may come on the partition (the KIP's prose), on the topic (a reading of its JSON
# diff) or both (oncelog until the KIP settles): the partition's wins, then the topic's, else None
# (the producer then assumes 5).
@pytest.mark.parametrize("partition_value, topic_value, reported", [
    (20, None, 20), (None, 12, 12), (20, 12, 20), (None, None, None)])
def test_produce_response_v14_window_from_partition_then_topic(partition_value, topic_value, reported):
    part = {1: struct.pack(">i", partition_value)} if partition_value is not None else {}
    topic = {1: struct.pack(">i", topic_value)} if topic_value is not None else {}
    [t] = produce.decode_response(14, produce_response_v14(uuid.uuid4(), topic, part))
    p = t.partitions[0]
    assert (p.batches_to_retain, p.topic_batches_to_retain, t.batches_to_retain) == (
        partition_value, topic_value, topic_value)
    assert p.reported_batches_to_retain == reported


def test_partition_tag_1_ignored_below_v14_beside_current_leader():
    lead = struct.pack(">ii", 3, 9) + b"\x00"
    body = produce_response_v14(uuid.uuid4(), {}, {0: lead, 1: struct.pack(">i", 20)})
    [t] = produce.decode_response(13, body)
    assert t.partitions[0].reported_batches_to_retain is None
    assert (t.partitions[0].leader_id, t.partitions[0].leader_epoch) == (3, 9)
    [t] = produce.decode_response(14, body)
    assert t.partitions[0].reported_batches_to_retain == 20 and t.partitions[0].leader_id == 3


def test_a_window_below_1_is_taken_as_absent():
    body = produce_response_v14(uuid.uuid4(), {1: struct.pack(">i", 12)}, {1: struct.pack(">i", 0)})
    [t] = produce.decode_response(14, body)
    assert t.partitions[0].reported_batches_to_retain == 12
    body = produce_response_v14(uuid.uuid4(), {1: struct.pack(">i", -3)}, {})
    [t] = produce.decode_response(14, body)
    assert t.partitions[0].reported_batches_to_retain is None


@pytest.mark.parametrize("version", [3, 8, 9, 12, 13])
@pytest.mark.parametrize("acks", [0, 1, -1])
def test_produce_request_acks_read_without_the_rest(version, acks):
    topics = {uuid.uuid4() if version >= 13 else "t": [(0, b"RECORDS")]}
    body = produce.encode_request(version, acks, 30000, topics, transactional_id="tx-é")
    assert produce.request_acks(version, body) == acks == produce.decode_request(version, body).acks


@pytest.mark.parametrize("version", [0, 1, 2])
def test_produce_v0_to_v2_request_and_response_by_hand(version):
    # kio has no Produce below v3 (Kafka 4 dropped them): the bytes of Kafka 3.x's schema
    topic = struct.pack(">h", 1) + b"t"
    body = produce.encode_request(version, 1, 30000, {"t": [(0, b"MESSAGES")]})
    assert body == struct.pack(">hii", 1, 30000, 1) + topic + struct.pack(">iii", 1, 0, 8) + b"MESSAGES"
    decoded = produce.decode_request(version, body)
    assert (decoded.transactional_id, decoded.acks, decoded.topics) == (None, 1, [("t", [(0, b"MESSAGES")])])
    assert produce.request_acks(version, body) == 1
    answer = produce.encode_response(version, [produce.TopicResponse("t", [produce.PartitionResponse(0, 0, 42, 99)])],
                                     throttle_ms=5)
    expected = struct.pack(">i", 1) + topic + struct.pack(">iihq", 1, 0, 0, 42)
    expected += (struct.pack(">q", 99) if version >= 2 else b"") + (struct.pack(">i", 5) if version >= 1 else b"")
    assert answer == expected
    [p] = produce.decode_response(version, answer)[0].partitions
    assert (p.base_offset, p.log_append_time) == (42, 99 if version >= 2 else -1)


def test_metadata_v0_request_and_response_match_kio():
    from kio.schema.metadata.v0.request import MetadataRequest
    from kio.schema.metadata.v0.response import MetadataResponse
    body = metadata.encode_request(0, None)
    value, size = entity_reader(MetadataRequest)(body, 0)
    assert size == len(body) and value.topics == ()  # all topics, in v0's words
    answer = metadata.encode_response(0, [metadata.BrokerEntry(1, "h", 9092, "rack")], "cluster", 1,
                                      [metadata.TopicEntry("t", 0, partitions=(metadata.PartitionEntry(0, 0, 1),))])
    value, size = entity_reader(MetadataResponse)(answer, 0)
    assert size == len(answer) and value.topics[0].name == "t"
    info = metadata.decode_response(0, answer)
    assert info.brokers[1].rack is None and info.controller_id == -1
    assert info.topics["t"].partitions[0].leader_id == 1
