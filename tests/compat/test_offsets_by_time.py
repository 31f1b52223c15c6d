"""ListOffsets against a real `oncelog serve`, asked by unmodified clients: offsets_for_times of
confluent-kafka (librdkafka) and kafka-python land on the first RECORD whose timestamp is at or
after the time, inside one batch, compressed or not (librdkafka tests 0054 offset_time and 0081
ListOffsets); librdkafka's admin list_offsets asks for MAX_TIMESTAMP (v7); hand-built requests
check the special timestamps per version as Kafka answers them."""
import asyncio
import time

import pytest

from oncelog.client.aio.connection import Connection
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode
from oncelog.storage.segment import scan_entries

# 0054's two timestamps, then times out of order: the first match is not always the largest time
TIMES = [1234, 999_999_999_999, 5000, 3000, 999_999_999_999, 4000]
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def create_topic(boot, topic, partitions=1, **configs):
    from confluent_kafka.admin import AdminClient, NewTopic
    a = AdminClient({"bootstrap.servers": boot})
    [f] = a.create_topics([NewTopic(topic, partitions, 1, config={k: str(v) for k, v in configs.items()})]).values()
    f.result(10)


def produce_one_batch(broker, topic, times, codec="none"):
    """`times` as the records of one batch of partition 0 (checked in the segment file)."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1000, "compression.type": codec,
                  "enable.idempotence": True})
    acks = []
    for i, ts in enumerate(times):
        p.produce(topic, value=b"record-%d" % i, partition=0, timestamp=ts,
                  on_delivery=lambda err, m: acks.append((err, m.offset())))
    assert p.flush(30) == 0
    assert sorted(acks) == [(None, i) for i in range(len(times))]
    [segment] = (broker.data_dir / f"{topic}-0").glob("*.log")
    [entry] = scan_entries(segment.read_bytes())
    assert entry.header.records_count == len(times) and entry.header.compression == CODECS.index(codec)


def first_at_or_after(times, target):
    return next(((o, t) for o, t in enumerate(times) if t >= target), None)


def targets(times):
    return sorted({0, *times, *(t - 1 for t in times), *(t + 1 for t in times)})


@pytest.mark.parametrize("codec", CODECS)
def test_offsets_for_times_land_on_the_record_inside_a_batch(shared_broker, unique_topic, codec):
    from confluent_kafka import Consumer, TopicPartition
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition
    create_topic(shared_broker.bootstrap, unique_topic)
    produce_one_batch(shared_broker, unique_topic, TIMES, codec)

    c = Consumer({"bootstrap.servers": shared_broker.bootstrap, "group.id": "unused"})
    k = KafkaConsumer(bootstrap_servers=shared_broker.bootstrap)
    try:
        for target in targets(TIMES):
            expected = first_at_or_after(TIMES, target)
            [got] = c.offsets_for_times([TopicPartition(unique_topic, 0, target)], 10)
            assert got.error is None
            assert got.offset == (expected[0] if expected else -1), (codec, target)
            tp = KTopicPartition(unique_topic, 0)
            found = k.offsets_for_times({tp: target})[tp]
            assert (None if found is None else (found.offset, found.timestamp)) == expected, (codec, target)
        # 0054's own check
        [got] = c.offsets_for_times([TopicPartition(unique_topic, 0, 999_999_999_999)], 10)
        assert got.offset == 1
    finally:
        c.close()
        k.close()


def test_admin_list_offsets_max_timestamp_earliest_latest_and_a_time(shared_broker, unique_topic):
    """librdkafka 0081: ListOffsets v7 with MAX_TIMESTAMP gives the first record holding the
    largest timestamp, with that timestamp."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec
    create_topic(shared_broker.bootstrap, unique_topic)
    produce_one_batch(shared_broker, unique_topic, TIMES, "lz4")
    a = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    tp = TopicPartition(unique_topic, 0)
    answers = {}
    for name, spec in [("max", OffsetSpec.max_timestamp()), ("earliest", OffsetSpec.earliest()),
                       ("latest", OffsetSpec.latest()), ("3500", OffsetSpec.for_timestamp(3500))]:
        [info] = a.list_offsets({tp: spec}, request_timeout=10).values()
        r = info.result()
        answers[name] = (r.offset, r.timestamp)
    assert answers == {"max": (1, 999_999_999_999), "earliest": (0, -1), "latest": (6, -1),
                       "3500": (1, 999_999_999_999)}


def test_log_append_time_topics_answer_the_batch_time(shared_broker, unique_topic):
    from kafka import KafkaConsumer, TopicPartition
    create_topic(shared_broker.bootstrap, unique_topic, **{"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    produce_one_batch(shared_broker, unique_topic, [1000, 2000, 3000])
    k = KafkaConsumer(bootstrap_servers=shared_broker.bootstrap)
    try:
        tp = TopicPartition(unique_topic, 0)
        found = k.offsets_for_times({tp: 2500})[tp]
        assert found.offset == 0 and found.timestamp >= before
        assert k.offsets_for_times({tp: found.timestamp + 1})[tp] is None
    finally:
        k.close()


# ------------------------------------------------------------------ hand-built requests

def list_offsets(boot, version, partitions):
    """ListOffsets at `version` for [(topic, partition, timestamp)]: {(topic, partition): answers}."""
    async def go():
        host, port = boot.rsplit(":", 1)
        conn = Connection(host, int(port), "offsets-by-time-test")
        await conn.connect(10)
        try:
            rq = entities.RequestBuilder(ApiKey.LIST_OFFSETS, version)
            by_topic = {}
            for topic, index, ts in partitions:
                by_topic.setdefault(topic, []).append(rq(
                    "ListOffsetsPartition", partition_index=index, timestamp=ts, current_leader_epoch=-1))
            req = rq.encode(replica_id=-1, isolation_level=0, timeout=1000,
                            topics=tuple(rq("ListOffsetsTopic", name=t, partitions=tuple(ps))
                                         for t, ps in by_topic.items()))
            body = await asyncio.wait_for(conn.request(ApiKey.LIST_OFFSETS, version, req), 10)
            r = entities.decode_response(ApiKey.LIST_OFFSETS, version, body)
            out = {}
            for t in r.topics:
                for p in t.partitions:
                    out.setdefault((t.name, p.partition_index), []).append(
                        (ErrorCode(p.error_code), p.timestamp, p.offset, getattr(p, "leader_epoch", None)))
            return out
        finally:
            conn.close()
    return asyncio.run(go())


def test_special_timestamps_per_version(shared_broker, unique_topic):
    create_topic(shared_broker.bootstrap, unique_topic)
    produce_one_batch(shared_broker, unique_topic, TIMES)
    boot, t = shared_broker.bootstrap, unique_topic

    def one(version, ts):
        [answer] = list_offsets(boot, version, [(t, 0, ts)])[(t, 0)]
        return answer[:3]

    ok, unsupported = ErrorCode.NONE, ErrorCode.UNSUPPORTED_VERSION
    assert one(6, -3) == (unsupported, -1, -1)            # MAX_TIMESTAMP needs v7
    assert one(7, -3) == (ok, 999_999_999_999, 1)
    assert one(7, -4) == (unsupported, -1, -1)            # EARLIEST_LOCAL needs v8
    assert one(8, -4) == (ok, -1, 0)                      # nothing tiered: the log start
    assert one(8, -5) == (unsupported, -1, -1)            # LATEST_TIERED needs v9
    assert one(9, -5) == (ok, -1, -1)                     # nothing tiered
    assert one(10, -6) == (unsupported, -1, -1)           # no such special timestamp
    assert one(10, -1) == (ok, -1, 6) and one(1, -2) == (ok, -1, 0)
    assert one(10, 3001) == (ok, 999_999_999_999, 1)
    assert one(10, 10**15) == (ok, -1, -1)                # nothing that late
    # a partition named twice is INVALID_REQUEST for both, as Kafka answers
    twice = list_offsets(boot, 9, [(t, 0, -1), (t, 0, -2)])[(t, 0)]
    assert [a[0] for a in twice] == [ErrorCode.INVALID_REQUEST] * 2


def test_a_message_format_v0_topic_refuses_a_search_by_time(shared_broker, unique_topic):
    create_topic(shared_broker.bootstrap, unique_topic, **{"message.format.version": "0.9.0"})
    [answer] = list_offsets(shared_broker.bootstrap, 7, [(unique_topic, 0, 1000)])[(unique_topic, 0)]
    assert answer[0] == ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT
    [answer] = list_offsets(shared_broker.bootstrap, 7, [(unique_topic, 0, -2)])[(unique_topic, 0)]
    assert answer[:3] == (ErrorCode.NONE, -1, 0)
