"""Every option of Spark's Kafka connector either acts or is refused by name (issue 39, item 4):
the timestamp options, minPartitions and maxRecordsPerPartition against the same data read by
confluent-kafka, minOffsetsPerTrigger / maxTriggerDelay, fetchOffset.*, kafkaConsumer.pollTimeoutMs,
groupIdPrefix, and refusals of what the connector cannot honour."""
import json
import time

import pytest

from oncelog.client import AdminClient, Producer
from oncelog.spark.options import OncelogSparkError, parse_duration_ms, read_options, write_options
from oncelog.spark.plan import retried

BS = {"bootstrap.servers": "127.0.0.1:1"}
BASE_TS = 1_700_000_000_000
RECORDS = 100       # record i: partition i % 2, timestamp BASE_TS + 10 * i


# ---------------------------------------------------------------------------- parsing (no broker)

@pytest.mark.parametrize("name, nearest", [("startingTimestmp", "startingTimestamp"),
                                           ("maxOffsetPerTrigger", "maxOffsetsPerTrigger"),
                                           ("groupIdPrefx", "groupIdPrefix")])
def test_a_misspelt_option_is_refused_naming_the_nearest(name, nearest):
    with pytest.raises(OncelogSparkError, match=f"option {name.lower()} is not an option of the "
                                                f"oncelog source .did you mean {nearest}"):
        read_options({**BS, "subscribe": "t", name: "1"}, streaming=True)
    with pytest.raises(OncelogSparkError, match="not an option of the oncelog sink"):
        write_options({**BS, "topic": "t", "tpoic": "u"})


@pytest.mark.parametrize("setting", ["auto.offset.reset", "key.deserializer", "value.deserializer",
                                     "enable.auto.commit", "interceptor.classes"])
def test_kafka_settings_spark_refuses_are_refused_by_name(setting):
    with pytest.raises(OncelogSparkError, match=f"option kafka.{setting} is not supported"):
        read_options({**BS, "subscribe": "t", f"kafka.{setting}": "x"}, streaming=False)


def test_sink_refuses_serializers_and_partitioner_class():
    for setting in ("key.serializer", "value.serializer", "partitioner.class"):
        with pytest.raises(OncelogSparkError, match=f"option kafka.{setting} is not supported"):
            write_options({**BS, "topic": "t", f"kafka.{setting}": "x"})


def test_timestamp_options_parsed_with_spark_precedence():
    ro = read_options({**BS, "subscribe": "t", "startingTimestamp": "5",
                       "startingOffsetsByTimestamp": '{"t":{"0":7}}',
                       "endingOffsetsByTimestamp": '{"t":{"0":9}}'}, streaming=False)
    assert ro.starting_ts == 5 and ro.ending_ts == {"t": {0: 9}} and ro.ts_strategy == "error"
    ro = read_options({**BS, "subscribe": "t", "startingOffsetsByTimestamp": '{"t":{"0":7}}',
                       "startingOffsetsByTimestampStrategy": "LATEST"}, streaming=True)
    assert ro.starting_ts == {"t": {0: 7}} and ro.ts_strategy == "latest"
    for bad in ('{"t":{"0":-1}}', '{"t":[1]}', '{"t":{"x":1}}', "nope"):
        with pytest.raises(OncelogSparkError, match="option startingOffsetsByTimestamp must be JSON"):
            read_options({**BS, "subscribe": "t", "startingOffsetsByTimestamp": bad}, streaming=True)
    with pytest.raises(OncelogSparkError, match="startingOffsetsByTimestampStrategy='never'"):
        read_options({**BS, "subscribe": "t", "startingOffsetsByTimestampStrategy": "never"},
                     streaming=True)
    for name in ("endingTimestamp", "endingOffsetsByTimestamp"):
        with pytest.raises(OncelogSparkError, match=f"option {name} is for batch reads only"):
            read_options({**BS, "subscribe": "t", name: '{"t":{"0":1}}' if "By" in name else "1"},
                         streaming=True)


def test_trigger_options_are_for_streams_and_durations_parse_as_spark():
    ro = read_options({**BS, "subscribe": "t", "minOffsetsPerTrigger": "50",
                       "maxTriggerDelay": "30s"}, streaming=True)
    assert ro.min_offsets_per_trigger == 50 and ro.max_trigger_delay_ms == 30_000
    assert read_options({**BS, "subscribe": "t"}, streaming=True).max_trigger_delay_ms == 900_000
    assert [parse_duration_ms(x, "d") for x in ("250", "250ms", "2m", "1h", "1d")] == \
        [250, 250, 120_000, 3_600_000, 86_400_000]
    with pytest.raises(OncelogSparkError, match="maxTriggerDelay='soon'"):
        read_options({**BS, "subscribe": "t", "maxTriggerDelay": "soon"}, streaming=True)
    for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"):
        with pytest.raises(OncelogSparkError, match=f"option {name} is for streaming reads only"):
            read_options({**BS, "subscribe": "t", name: "10"}, streaming=False)


def test_group_id_options_name_the_consumers_which_never_commit():
    ro = read_options({**BS, "subscribe": "t", "groupIdPrefix": "etl"}, streaming=True)
    assert ro.client["group.id"].startswith("etl-") and ro.client["enable.auto.commit"] == "false"
    assert read_options({**BS, "subscribe": "t"}, streaming=True).client["group.id"] \
        .startswith("spark-kafka-source-")
    ro = read_options({**BS, "subscribe": "t", "kafka.group.id": "mine"}, streaming=True)
    assert ro.client["group.id"] == "mine"


def test_fetch_offset_retries_and_interval():
    ro = read_options({**BS, "subscribe": "t", "fetchOffset.numRetries": "2",
                       "fetchOffset.retryIntervalMs": "1"}, streaming=True)
    calls = []

    def flaky(fail: int):
        def fetch():
            calls.append(1)
            if len(calls) <= fail:
                raise ConnectionError("gone")
            return "ok"
        return fetch
    assert retried(ro, "listing", flaky(2)) == "ok" and len(calls) == 3
    calls.clear()
    with pytest.raises(OncelogSparkError, match=r"listing failed 3 time\(s\) .fetchOffset.numRetries=2.: "
                                                "ConnectionError: gone"):
        retried(ro, "listing", flaky(3))


# ---------------------------------------------------------------------------- against a broker

def _timed_topic(bootstrap: str) -> str:
    """Two partitions, RECORDS records with timestamps 10 ms apart (even i on partition 0)."""
    topic = f"spark-timed-{time.time_ns()}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([topic], num_partitions=2)[topic].result()
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as p:
        for i in range(RECORDS):
            p.send(topic, value=f"v{i}".encode(), partition=i % 2, timestamp=BASE_TS + 10 * i)
        p.flush()
    return topic


@pytest.fixture(scope="module")
def timed_topic(shared_broker):
    return _timed_topic(shared_broker.bootstrap)


def _confluent_range(bootstrap: str, topic: str, start_ts: int, end_ts: int | None):
    """What confluent-kafka reads between the offsets its offsets_for_times gives:
    {(partition, offset): value}."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "ts-check",
                  "enable.auto.commit": False})
    try:
        starts = c.offsets_for_times([TopicPartition(topic, p, start_ts) for p in (0, 1)], 10)
        ends = (c.offsets_for_times([TopicPartition(topic, p, end_ts) for p in (0, 1)], 10)
                if end_ts is not None else None)
        out = {}
        for p in (0, 1):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), 10)
            s = starts[p].offset if starts[p].offset >= 0 else hi
            e = ends[p].offset if ends is not None and ends[p].offset >= 0 else hi
            if s >= e:
                continue
            c.assign([TopicPartition(topic, p, s)])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                m = c.poll(1)
                if m is None or m.error():
                    continue
                if m.offset() >= e:
                    break
                out[(p, m.offset())] = m.value()
                if m.offset() == e - 1:
                    break
        return out
    finally:
        c.close()


def _planned(bootstrap, topic, streaming=False, **options):
    """The ranges the connector's driver plans for a batch read: {(partition, (start, end))}."""
    from oncelog.spark.source import BatchReader
    reader = BatchReader({"bootstrap.servers": bootstrap, "subscribe": topic, **options})
    return {(r.range.partition, (r.range.start, r.range.end)) for r in reader.partitions()
            if r.range.topic}


def test_starting_and_ending_times_plan_what_confluent_kafka_finds(shared_broker, timed_topic):
    bs = shared_broker.bootstrap
    start, end = BASE_TS + 305, BASE_TS + 705
    want = _confluent_range(bs, timed_topic, start, end)
    # record 32 (p0, offset 16) and 31 (p1, offset 15) are the first at or after 305 ms; 72
    # (p0, offset 36) and 71 (p1, offset 35) the first at or after 705 ms (ending is exclusive)
    assert min(want) == (0, 16) and min(k for k in want if k[0] == 1) == (1, 15)
    assert max(want) == (1, 34) and max(k for k in want if k[0] == 0) == (0, 35)
    ranges = {p: r for p, r in _planned(bs, timed_topic, startingTimestamp=str(start),
                                        endingTimestamp=str(end))}
    got = {(p, o) for p, (s, e) in ranges.items() for o in range(s, e)}
    assert got == set(want)
    # the same through the per-partition JSON, and an ending time past every record = the end
    by_partition = json.dumps({timed_topic: {"0": start, "1": start}})
    ranges = {p: r for p, r in _planned(bs, timed_topic, startingOffsetsByTimestamp=by_partition,
                                        endingTimestamp=str(BASE_TS + 10 * RECORDS))}
    assert ranges == {0: (16, 50), 1: (15, 50)}
    # a JSON of times names every partition the query reads (as Spark's)
    with pytest.raises(OncelogSparkError, match=f"missing {timed_topic}-1"):
        _planned(bs, timed_topic, startingOffsetsByTimestamp=json.dumps({timed_topic: {"0": 1}}))


def test_a_starting_time_after_every_record_fails_or_starts_at_the_end(shared_broker, timed_topic):
    bs, future = shared_broker.bootstrap, str(int(time.time() * 1000) + 3_600_000)
    with pytest.raises(OncelogSparkError, match=r"option startingTimestamp: .*-0 has no record with "
                                                r"a timestamp at or after"):
        _planned(bs, timed_topic, startingTimestamp=future)
    assert _planned(bs, timed_topic, startingTimestamp=future,
                    startingOffsetsByTimestampStrategy="latest") == set()


def test_min_partitions_and_max_records_per_partition_split_what_confluent_reads(shared_broker, timed_topic):
    """Spark's KafkaOffsetRangeCalculator: at least minPartitions input partitions, none holding
    more than maxRecordsPerPartition offsets, together every record confluent-kafka reads once."""
    from oncelog.spark.source import BatchReader
    bs = shared_broker.bootstrap
    want = set(_confluent_range(bs, timed_topic, 0, None))
    assert len(want) == RECORDS
    for options, least, most in (({"minPartitions": "7"}, 7, RECORDS), ({"maxRecordsPerPartition": "12"}, 2, 12),
                                 ({"minPartitions": "3", "maxRecordsPerPartition": "40"}, 3, 40)):
        pieces = [r.range for r in BatchReader({"bootstrap.servers": bs, "subscribe": timed_topic,
                                                **options}).partitions() if r.range.topic]
        assert len(pieces) >= least and all(0 < r.end - r.start <= most for r in pieces), (options, pieces)
        offsets = [(r.partition, o) for r in pieces for o in range(r.start, r.end)]
        assert len(offsets) == len(set(offsets)) and set(offsets) == want, options


def test_a_read_that_sees_no_record_for_the_poll_timeout_fails_naming_it(shared_broker):
    """kafkaConsumer.pollTimeoutMs: a read task that gets nothing for that long fails (here a range
    past the end of an empty partition; in life a broker that stopped answering)."""
    from oncelog.spark.arrow_io import read_range
    from oncelog.spark.plan import OffsetRange
    topic = f"spark-empty-{time.time_ns()}"
    with AdminClient({"bootstrap.servers": shared_broker.bootstrap}) as admin:
        admin.create_topics([topic])[topic].result()
    ro = read_options({"bootstrap.servers": shared_broker.bootstrap, "subscribe": topic,
                       "kafkaConsumer.pollTimeoutMs": "300"}, streaming=False)
    assert ro.poll_timeout_ms == 300
    with pytest.raises(OncelogSparkError, match=rf"{topic}-0: no records at offset 0 for "
                                                r"kafkaConsumer.pollTimeoutMs=300 while reading up to 5"):
        list(read_range(ro.client, OffsetRange(topic, 0, 0, 5), False, True, ro.poll_timeout_ms))


def test_min_offsets_per_trigger_holds_batches_until_enough_or_max_delay(shared_broker):
    from oncelog.spark.source import StreamReader
    timed_topic = _timed_topic(shared_broker.bootstrap)   # its own: this test adds records
    now = [0.0]

    class Clocked(StreamReader):
        def _now_ms(self) -> float:
            return now[0]
    reader = Clocked({"bootstrap.servers": shared_broker.bootstrap, "subscribe": timed_topic,
                      "startingOffsets": json.dumps({timed_topic: {"0": 40, "1": 40}}),
                      "minOffsetsPerTrigger": "30", "maxTriggerDelay": "1m"})
    try:
        start = reader.initialOffset()
        assert start == {timed_topic: {"0": 40, "1": 40}}
        now[0] = 1_000_000.0
        # the first trigger runs at once (20 offsets wait, fewer than 30)
        first = reader.latestOffset(start, reader.getDefaultReadLimit())
        assert first == {timed_topic: {"0": 50, "1": 50}}
        # nothing new: held back; then 20 more, still fewer than 30: held back
        assert reader.latestOffset(first, reader.getDefaultReadLimit()) == first
        with Producer({"bootstrap.servers": shared_broker.bootstrap}) as p:
            for i in range(20):
                p.send(timed_topic, value=b"late", partition=i % 2)
            p.flush()
        now[0] += 59_000
        assert reader.latestOffset(first, reader.getDefaultReadLimit()) == first
        # maxTriggerDelay passed since the last batch: the 20 go
        now[0] += 1_000
        assert reader.latestOffset(first, reader.getDefaultReadLimit()) == \
            {timed_topic: {"0": 60, "1": 60}}
    finally:
        reader.stop()


def test_spark_reads_between_times_what_confluent_kafka_reads(spark, shared_broker, timed_topic):
    """One Spark read (the session's): the rows between two times are those confluent-kafka
    reads between the offsets its offsets_for_times gives."""
    start, end = BASE_TS + 105, BASE_TS + 555
    rows = (spark.read.format("oncelog").option("bootstrap.servers", shared_broker.bootstrap)
            .option("subscribe", timed_topic).option("startingTimestamp", str(start))
            .option("endingTimestamp", str(end)).load()
            .select("partition", "offset", "value").collect())
    got = {(r["partition"], r["offset"]): bytes(r["value"]) for r in rows}
    assert got == _confluent_range(shared_broker.bootstrap, timed_topic, start, end)
    assert len(got) == 45
