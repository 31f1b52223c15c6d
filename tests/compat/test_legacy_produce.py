"""Produce v0-v2 and Metadata v0 against a real `oncelog serve`, as Kafka 3.x serves them to a
client told not to ask ApiVersions (librdkafka's `api.version.request=false,
broker.version.fallback=0.9.0`, its test 0052): a v0/v1 message set, plain or in a gzip
wrapper, is stored as one v2 batch without producer id (checked in the segment file) with the
timestamps Kafka's LogValidator gives it (none for magic 0 on a CreateTime topic, the message's
own for magic 1, the broker's on a LogAppendTime topic), and confluent-kafka reads it back.
Requests are written with the protocol layer over a socket; the answers are read the same way."""
import struct
import time

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog.protocol import metadata as metadata_codec
from oncelog.protocol import produce as produce_codec
from oncelog.protocol.compression import CODEC_NAMES, compress
from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.records import Record, encode_batch, encode_legacy_message
from oncelog.storage.segment import scan_entries
from oncelog.testing.raw_client import RawConnection

pytestmark = pytest.mark.processes
GZIP = CODEC_NAMES["gzip"]
CREATE_TS = 1_700_000_000_000


def call(boot, api_key, version, body):
    """One request; its response frame from the correlation id on."""
    with RawConnection(boot) as c:
        correlation = c.send(api_key, version, body)
        frame = c.recv_frame()
    assert struct.unpack(">i", frame[:4])[0] == correlation
    return frame


def produce(boot, version, topic, records):
    frame = call(boot, 0, version, produce_codec.encode_request(version, 1, 10_000, {topic: [(0, records)]}))
    [t] = produce_codec.decode_response(version, frame, 4)
    return t.partitions[0], frame


def message_set(magic, n, codec=0, tag=b""):
    """n messages k0..k{n-1}; magic 1 ones are timestamped CREATE_TS + i; `codec`: in one wrapper
    whose inner offsets are relative (0, 1, ...), as librdkafka writes both magics."""
    msgs = [encode_legacy_message(i, b"k%d" % i, tag + b"v%d" % i, magic=magic,
                                  timestamp=CREATE_TS + i if magic else -1) for i in range(n)]
    if not codec:
        return b"".join(msgs)
    return encode_legacy_message(n - 1 if magic else 0, None, compress(codec, b"".join(msgs)), magic=magic,
                                 timestamp=CREATE_TS + n - 1 if magic else -1, compression_codec=codec)


def create_topic(boot, topic, timestamp_type):
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic(topic, 1, 1, config={"message.timestamp.type": timestamp_type})])[topic].result(30)


def read_all(boot, topic, n):
    c = Consumer({"bootstrap.servers": boot, "group.id": f"{topic}-r", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    out, deadline = [], time.monotonic() + 30
    try:
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                out.append((m.offset(), m.key(), m.value(), m.timestamp()))
    finally:
        c.close()
    return out


def stored_headers(broker, topic):
    out = []
    for segment in sorted((broker.data_dir / f"{topic}-0").glob("*.log")):
        out += [e.header for e in scan_entries(segment.read_bytes())]
    return out


@pytest.mark.parametrize("codec", [0, GZIP], ids=["none", "gzip"])
@pytest.mark.parametrize("timestamp_type", ["CreateTime", "LogAppendTime"])
def test_produce_v1_magic_0_is_stored_as_a_v2_batch(shared_broker, unique_topic, timestamp_type, codec):
    boot = shared_broker.bootstrap
    create_topic(boot, unique_topic, timestamp_type)
    before = int(time.time() * 1000)
    first, _ = produce(boot, 1, unique_topic, message_set(0, 4, codec))
    second, _ = produce(boot, 1, unique_topic, message_set(0, 3, codec, tag=b"again-"))
    after = int(time.time() * 1000)
    assert (first.error_code, first.base_offset, second.error_code, second.base_offset) == (0, 0, 0, 4)
    assert first.log_append_time == -1  # not in v1's answer
    stored = stored_headers(shared_broker, unique_topic)
    assert [(h.magic, h.base_offset, h.records_count, h.producer_id, h.compression) for h in stored] == [
        (2, 0, 4, -1, codec), (2, 4, 3, -1, codec)]
    got = read_all(boot, unique_topic, 7)
    assert [(o, k, v) for o, k, v, _ts in got] == [(i, b"k%d" % i, b"v%d" % i) for i in range(4)] + [
        (4 + i, b"k%d" % i, b"again-v%d" % i) for i in range(3)]
    if timestamp_type == "CreateTime":
        assert {ts for *_r, ts in got} == {(TIMESTAMP_CREATE_TIME, -1)}  # magic 0 has none
    else:
        assert {kind for *_r, (kind, _t) in got} == {TIMESTAMP_LOG_APPEND_TIME}
        assert all(before <= t <= after for *_r, (_k, t) in got)


@pytest.mark.parametrize("timestamp_type", ["CreateTime", "LogAppendTime"])
def test_produce_v2_gzip_magic_1_keeps_create_times_or_takes_the_append_time(shared_broker, unique_topic,
                                                                              timestamp_type):
    boot = shared_broker.bootstrap
    create_topic(boot, unique_topic, timestamp_type)
    answer, _ = produce(boot, 2, unique_topic, message_set(1, 5, GZIP))
    assert (answer.error_code, answer.base_offset) == (0, 0)
    [h] = stored_headers(shared_broker, unique_topic)
    assert (h.magic, h.records_count, h.producer_id, h.compression) == (2, 5, -1, GZIP)
    got = read_all(boot, unique_topic, 5)
    assert [(o, k, v) for o, k, v, _ts in got] == [(i, b"k%d" % i, b"v%d" % i) for i in range(5)]
    if timestamp_type == "CreateTime":
        assert answer.log_append_time == -1
        assert [ts for *_r, ts in got] == [(TIMESTAMP_CREATE_TIME, CREATE_TS + i) for i in range(5)]
    else:
        assert answer.log_append_time > 0
        assert {ts for *_r, ts in got} == {(TIMESTAMP_LOG_APPEND_TIME, answer.log_append_time)}


def test_produce_v0_answer_has_no_throttle_time_and_v2_accepts_a_v2_batch(shared_broker, unique_topic):
    boot = shared_broker.bootstrap
    create_topic(boot, unique_topic, "CreateTime")
    answer, frame = produce(boot, 0, unique_topic, message_set(0, 2))
    assert (answer.error_code, answer.base_offset) == (0, 0)
    name = unique_topic.encode()
    # correlation id, [topic name, [index, error, base offset]] and nothing after
    assert len(frame) == 4 + 4 + 2 + len(name) + 4 + 4 + 2 + 8
    # Kafka checks the magic from v3 only (ProduceRequest.validateRecords)
    batch = encode_batch([Record(0, CREATE_TS, b"k", b"v2")])
    answer, _ = produce(boot, 2, unique_topic, batch)
    assert (answer.error_code, answer.base_offset) == (0, 2)
    assert [(o, v, ts[1]) for o, _k, v, ts in read_all(boot, unique_topic, 3)] == [
        (0, b"v0", -1), (1, b"v1", -1), (2, b"v2", CREATE_TS)]


def test_produce_v3_refuses_a_v0_v1_message_set(shared_broker, unique_topic):
    boot = shared_broker.bootstrap
    create_topic(boot, unique_topic, "CreateTime")
    answer, _ = produce(boot, 3, unique_topic, message_set(1, 2))
    assert answer.error_code == ErrorCode.INVALID_RECORD
    assert stored_headers(shared_broker, unique_topic) == []


def test_metadata_v0_with_no_topics_answers_all_topics(shared_broker, unique_topic):
    boot = shared_broker.bootstrap
    for suffix in ("a", "b"):
        create_topic(boot, unique_topic + suffix, "CreateTime")
    frame = call(boot, 3, 0, metadata_codec.encode_request(0, []))
    answer = metadata_codec.decode_response(0, frame, 4)
    assert {unique_topic + "a", unique_topic + "b"} <= set(answer.topics)
    assert answer.brokers and answer.topics[unique_topic + "a"].partitions[0].leader_id in answer.brokers
    frame = call(boot, 3, 0, metadata_codec.encode_request(0, [unique_topic + "b"]))
    assert list(metadata_codec.decode_response(0, frame, 4).topics) == [unique_topic + "b"]
    # v1: an empty array asks for none
    frame = call(boot, 3, 1, metadata_codec.encode_request(1, []))
    assert metadata_codec.decode_response(1, frame, 4).topics == {}
