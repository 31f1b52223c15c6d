"""Topic config `compression.type` against a real `oncelog serve`, set and read by unmodified
admin clients: CreateTopics accepts it (librdkafka 0081 failed there with INVALID_CONFIG),
DescribeConfigs shows it, IncrementalAlterConfigs changes it; a batch produced under another
codec is stored under the topic's (checked in the segment file), with its producer id and
sequence intact (an idempotent retry is still a duplicate), and consumers read the records."""
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from oncelog.protocol.compression import CODEC_NAMES
from oncelog.storage.segment import scan_entries

pytestmark = pytest.mark.processes


def create_topic(admin, topic, **configs):
    admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(30)


def produce(bootstrap, topic, codec, n=20, tag=b""):
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "compression.type": codec,
                  "linger.ms": 50})
    for i in range(n):
        p.produce(topic, value=tag + b"value-%03d-" % i + b"x" * 200, key=b"k%d" % i, partition=0,
                  timestamp=1_700_000_000_000 + i)
    assert p.flush(30) == 0


def stored_codecs(broker, topic):
    out = []
    for segment in sorted((broker.data_dir / f"{topic}-0").glob("*.log")):
        out += [e.header.compression for e in scan_entries(segment.read_bytes())]
    return out


def read_all(bootstrap, topic, n):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-r", "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, 0, 0)])
    out, deadline = [], time.monotonic() + 30
    try:
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                out.append((m.offset(), m.key(), m.value(), m.timestamp()[1]))
    finally:
        c.close()
    return out


def topic_compression(admin, topic):
    [f] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return f.result(10)["compression.type"].value


@pytest.mark.parametrize("topic_codec,producer_codec", [("zstd", "none"), ("gzip", "lz4"),
                                                        ("uncompressed", "snappy"), ("producer", "lz4")])
def test_batches_are_stored_under_the_topics_codec(broker, unique_topic, topic_codec, producer_codec):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    create_topic(admin, unique_topic, **{"compression.type": topic_codec})
    assert topic_compression(admin, unique_topic) == topic_codec
    produce(broker.bootstrap, unique_topic, producer_codec)
    expected = CODEC_NAMES[producer_codec if topic_codec == "producer" else
                           "none" if topic_codec == "uncompressed" else topic_codec]
    codecs = stored_codecs(broker, unique_topic)
    assert codecs and set(codecs) == {expected}, codecs
    got = read_all(broker.bootstrap, unique_topic, 20)
    assert got == [(i, b"k%d" % i, b"value-%03d-" % i + b"x" * 200, 1_700_000_000_000 + i) for i in range(20)]


def test_altered_codec_applies_to_the_next_batches_and_dedup_survives_recompression(broker, unique_topic):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    create_topic(admin, unique_topic)
    assert topic_compression(admin, unique_topic) == "producer"  # Kafka's default
    produce(broker.bootstrap, unique_topic, "none", n=5)
    [f] = admin.incremental_alter_configs([ConfigResource("topic", unique_topic, incremental_configs=[
        ConfigEntry("compression.type", "gzip", incremental_operation=AlterConfigOpType.SET)])]).values()
    f.result(10)
    assert topic_compression(admin, unique_topic) == "gzip"
    produce(broker.bootstrap, unique_topic, "zstd", n=5, tag=b"after-")
    codecs = stored_codecs(broker, unique_topic)
    assert codecs[0] == CODEC_NAMES["none"] and codecs[-1] == CODEC_NAMES["gzip"], codecs
    assert len(read_all(broker.bootstrap, unique_topic, 10)) == 10
    # an invalid codec is refused as Kafka refuses it
    with pytest.raises(KafkaException) as e:
        create_topic(admin, unique_topic + "-bad", **{"compression.type": "brotli"})
    assert e.value.args[0].code() == KafkaError.INVALID_CONFIG
