"""Option parsing and planning arithmetic (no broker, no Spark)."""
import json

import pytest

from oncelog.spark.options import OncelogSparkError, canonical, parse_offsets_json, read_options, write_options
from oncelog.spark.plan import OffsetRange, limit_rows, resolve, split

BS = {"bootstrap.servers": "127.0.0.1:1"}


def test_offsets_json_parsed_and_canonical_text_is_stable():
    parsed = parse_offsets_json('{"b":{"1":5,"0":-2},"a":{"10":3,"2":-1}}', "startingOffsets")
    assert parsed == {"b": {1: 5, 0: -2}, "a": {10: 3, 2: -1}}
    c = canonical(parsed)
    # Spark compares offsets as JSON text: the same offsets must always print the same way
    assert json.dumps(c) == '{"a": {"2": -1, "10": 3}, "b": {"0": -2, "1": 5}}'
    assert json.dumps(canonical({"b": {0: -2, 1: 5}, "a": {2: -1, 10: 3}})) == json.dumps(c)


@pytest.mark.parametrize("raw", ['{"t":{"0":23', '[1,2]', '{"t":[0,1]}', '{"t":{"x":1}}',
                                 '{"t":{"0":-3}}', '{"t":{"0":"5"}}'])
def test_bad_offsets_json_says_what_is_expected(raw):
    with pytest.raises(OncelogSparkError, match=r'earliest, latest or JSON like'):
        read_options({**BS, "subscribe": "t", "startingOffsets": raw}, streaming=True)


def test_exactly_one_of_subscribe_assign_pattern():
    with pytest.raises(OncelogSparkError, match="exactly one of"):
        read_options(BS, streaming=False)
    with pytest.raises(OncelogSparkError, match="got subscribe, assign"):
        read_options({**BS, "subscribe": "a", "assign": '{"a":[0]}'}, streaming=False)
    with pytest.raises(OncelogSparkError, match="bootstrap.servers is required"):
        read_options({"subscribe": "a"}, streaming=False)


def test_batch_rules_of_spark_kafka_source():
    with pytest.raises(OncelogSparkError, match="not allowed for batch"):
        read_options({**BS, "subscribe": "a", "startingOffsets": "latest"}, streaming=False)
    with pytest.raises(OncelogSparkError, match="-2 .earliest. is not allowed"):
        read_options({**BS, "subscribe": "a", "endingOffsets": '{"a":{"0":-2}}'}, streaming=False)
    with pytest.raises(OncelogSparkError, match="batch reads only"):
        read_options({**BS, "subscribe": "a", "endingOffsets": "latest"}, streaming=True)
    ro = read_options({**BS, "kafka.client.id": "x", "subscribe": "a, b",
                       "maxOffsetsPerTrigger": "10"}, streaming=True)
    assert ro.subscribe == ["a", "b"] and ro.starting == "latest"
    assert ro.client["bootstrap.servers"] == "127.0.0.1:1" and ro.client["client.id"] == "x"
    # the source's consumers never commit; their group id only names them (as Spark's)
    assert ro.client["enable.auto.commit"] == "false" and ro.client["group.id"].startswith("spark-kafka-source-")
    assert ro.max_offsets_per_trigger == 10
    with pytest.raises(OncelogSparkError, match="maxOffsetsPerTrigger"):
        read_options({**BS, "subscribe": "a", "maxOffsetsPerTrigger": "ten"}, streaming=True)


def test_writer_always_idempotent():
    wo = write_options({**BS, "topic": "t", "kafka.enable.idempotence": "false"})
    assert wo.client["enable.idempotence"] == "true" and wo.topic == "t"


def test_resolve_json_and_symbolic_positions():
    tps = [("a", 0), ("a", 1)]
    lo, hi = {("a", 0): 5, ("a", 1): 0}, {("a", 0): 50, ("a", 1): 7}
    assert resolve("earliest", tps, lo, hi, -2, "s") == {"a": {0: 5, 1: 0}}
    assert resolve({"a": {0: 10, 1: -1}}, tps, lo, hi, -2, "s") == {"a": {0: 10, 1: 7}}
    assert resolve({"a": {0: 10}}, tps, lo, hi, -2, "s") == {"a": {0: 10, 1: 0}}
    with pytest.raises(OncelogSparkError, match="beyond its end 50"):
        resolve({"a": {0: 51}}, tps, lo, hi, -2, "s")
    with pytest.raises(OncelogSparkError, match="does not read: a-9"):
        resolve({"a": {9: 1}}, tps, lo, hi, -2, "s")


def test_split_covers_each_range_exactly_once():
    ranges = [OffsetRange("a", 0, 0, 1000), OffsetRange("a", 1, 10, 20), OffsetRange("b", 0, 5, 5)]
    out = split(ranges, min_partitions=8, max_records=None)
    assert len(out) >= 8
    for r in ranges:
        mine = sorted((x.start, x.end) for x in out if (x.topic, x.partition) == (r.topic, r.partition))
        covered = [o for s, e in mine for o in range(s, e)]
        assert covered == list(range(r.start, r.end))
    assert all(x.size <= 100 for x in split(ranges, None, 100))


def test_limit_rows_admits_exactly_max_rows_in_proportion():
    start = {"a": {0: 0, 1: 100}}
    latest = {"a": {0: 300, 1: 200}}
    got = limit_rows(start, latest, 100)
    assert got["a"][0] - 0 + got["a"][1] - 100 == 100
    assert got["a"][0] == 75 and got["a"][1] == 125
    assert limit_rows(start, latest, 1000) == latest
    one = limit_rows({"a": {0: 0, 1: 0}}, {"a": {0: 1, 1: 1}}, 1)
    assert sum(one["a"].values()) == 1
