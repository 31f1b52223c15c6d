"""Batch reads and writes through format("oncelog") against a real broker."""
import pytest
from pyspark.sql import functions as F
from tests.tiers import size

from conftest import read_topic

ROWS = size(20_000, 100_000)


def test_round_trip_of_many_rows_equal_contents(spark, spark_broker, make_topic, write_opts):
    topic = make_topic(4)
    src = spark.range(ROWS, numPartitions=4).selectExpr(
        "CAST(id AS STRING) AS key",
        "concat('value-', CAST(id AS STRING), '-', repeat('x', CAST(id % 40 AS INT))) AS value")
    src.write.format("oncelog").options(**write_opts).option("topic", topic).mode("append").save()

    back = read_topic(spark, spark_broker, topic)
    assert back.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>")
    got = back.selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value").cache()
    assert got.count() == ROWS
    assert got.exceptAll(src).count() == 0 and src.exceptAll(got).count() == 0
    # offsets of each partition are dense from 0: nothing lost, nothing written twice
    per = back.groupBy("partition").agg(F.min("offset").alias("lo"), F.max("offset").alias("hi"),
                                        F.count("*").alias("n")).collect()
    assert len(per) == 4
    assert all(r["lo"] == 0 and r["hi"] == r["n"] - 1 for r in per)
    # the same key always goes to the same partition (Kafka's murmur2 partitioner)
    assert back.groupBy("key").agg(F.countDistinct("partition").alias("p")) \
        .filter("p > 1").count() == 0
    got.unpersist()


def test_headers_partition_and_topic_columns(spark, spark_broker, make_topic, write_opts):
    topic = make_topic(3)
    rows = [(topic, 2, b"k1", b"v1", [("h", b"1"), ("h2", b"")]),
            (topic, 0, None, b"v2", []),
            (topic, 2, b"k3", b"v3", None)]
    df = spark.createDataFrame(rows, "topic string, partition int, key binary, value binary, "
                                     "headers array<struct<key:string,value:binary>>")
    df.write.format("oncelog").options(**write_opts).option("includeHeaders", "true") \
        .mode("append").save()
    back = read_topic(spark, spark_broker, topic, includeHeaders="true").orderBy("value").collect()
    assert [(r["partition"], r["key"], r["value"]) for r in back] == [
        (2, b"k1", b"v1"), (0, None, b"v2"), (2, b"k3", b"v3")]
    assert [(h["key"], h["value"]) for h in back[0]["headers"]] == [("h", b"1"), ("h2", b"")]
    assert back[1]["headers"] == [] and back[2]["headers"] == []


def test_offset_ranges_min_partitions_and_assign(spark, spark_broker, make_topic, produce):
    topic = make_topic(2)
    produce(topic, [f"a{i}".encode() for i in range(60)], partition=0)
    produce(topic, [f"b{i}".encode() for i in range(40)], partition=1)

    ranged = read_topic(spark, spark_broker, topic,
                        startingOffsets=f'{{"{topic}":{{"0":10,"1":-2}}}}',
                        endingOffsets=f'{{"{topic}":{{"0":20,"1":-1}}}}')
    got = sorted((r["partition"], r["offset"]) for r in ranged.select("partition", "offset").collect())
    assert got == [(0, o) for o in range(10, 20)] + [(1, o) for o in range(40)]

    split = read_topic(spark, spark_broker, topic, minPartitions="7")
    assert split.rdd.getNumPartitions() >= 7
    assert sorted(r["value"] for r in split.select("value").collect()) == sorted(
        [f"a{i}".encode() for i in range(60)] + [f"b{i}".encode() for i in range(40)])

    assigned = (spark.read.format("oncelog").option("bootstrap.servers", spark_broker)
                .option("assign", f'{{"{topic}":[1]}}').load())
    assert assigned.count() == 40 and {r[0] for r in assigned.select("partition").collect()} == {1}


def test_subscribe_pattern(spark, spark_broker, make_topic, produce):
    a, b = make_topic(1), make_topic(1)
    produce(a, [b"x"] * 3)
    produce(b, [b"y"] * 4)
    df = (spark.read.format("oncelog").option("bootstrap.servers", spark_broker)
          .option("subscribePattern", f"({a}|{b})").load())
    assert sorted(r["topic"] for r in df.select("topic").collect()) == sorted([a] * 3 + [b] * 4)


def test_fail_on_data_loss(spark, spark_broker, make_topic, produce):
    from oncelog.client import AdminClient
    topic = make_topic(1)
    produce(topic, [f"d{i}".encode() for i in range(100)])
    with AdminClient({"bootstrap.servers": spark_broker}) as admin:
        admin.delete_records({(topic, 0): 50})
    start = f'{{"{topic}":{{"0":10}}}}'
    with pytest.raises(Exception) as e:
        read_topic(spark, spark_broker, topic, startingOffsets=start).count()
    assert f"{topic}-0: offsets 10..49 were deleted" in _error_text(e)
    assert "failOnDataLoss=false" in _error_text(e)
    kept = read_topic(spark, spark_broker, topic, startingOffsets=start, failOnDataLoss="false")
    assert sorted(r["offset"] for r in kept.select("offset").collect()) == list(range(50, 100))


def _error_text(excinfo) -> str:
    return str(excinfo.value)


def test_unknown_topic_is_a_clear_error(spark, spark_broker):
    with pytest.raises(Exception) as e:
        read_topic(spark, spark_broker, "no-such-topic-xyz").count()
    assert "unknown topic(s) no-such-topic-xyz" in _error_text(e)
    assert "create them first" in _error_text(e)


def test_bad_offsets_json_is_a_clear_error(spark, spark_broker, make_topic):
    topic = make_topic(1)
    with pytest.raises(Exception) as e:
        read_topic(spark, spark_broker, topic, startingOffsets='{"oops"').count()
    assert "option startingOffsets must be earliest, latest or JSON like" in _error_text(e)


def test_unreachable_broker_is_a_clear_error(spark):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()   # nothing listens there now
    with pytest.raises(Exception) as e:
        (spark.read.format("oncelog").option("bootstrap.servers", f"127.0.0.1:{port}")
         .option("kafka.request.timeout.ms", "2000").option("subscribe", "t").load().count())
    assert f"cannot reach the broker at bootstrap.servers='127.0.0.1:{port}'" in _error_text(e)


def test_missing_value_column_is_a_clear_error(spark, spark_broker, make_topic):
    topic = make_topic(1)
    with pytest.raises(Exception) as e:
        spark.range(3).write.format("oncelog").option("bootstrap.servers", spark_broker) \
            .option("topic", topic).mode("append").save()
    assert "needs a `value` column" in _error_text(e)


def test_format_is_found_without_register():
    """What Spark's lookup_data_sources.py does at first use: scan for pyspark_* modules."""
    from importlib import import_module
    from pkgutil import iter_modules

    from pyspark.sql.datasource import DataSource
    found = {}
    for info in iter_modules():
        if info.name.startswith("pyspark_"):
            mod = import_module(info.name)
            if hasattr(mod, "DefaultSource") and issubclass(mod.DefaultSource, DataSource):
                found[mod.DefaultSource.name()] = mod.DefaultSource
    assert "oncelog" in found
