import os
import random
from collections import Counter

import pytest
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from oncelog.client.aio.producer import AIOProducer
from oncelog.client.errors import ConfigError
from oncelog.client.partitioner import StickyPartitioner, murmur2, partition_for_key
from oncelog.protocol.records import BATCH_OVERHEAD


def test_java_vectors():
    # org.apache.kafka.common.utils.UtilsTest#testMurmur2
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert murmur2(b"a-little-bit-longer-string") == -1486304829
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971
    assert murmur2(b"abc") == 479470107


def test_agrees_with_kafka_python_on_random_keys():
    for i in range(3000):
        key = os.urandom(i % 41)
        assert murmur2(key) & 0xFFFFFFFF == kafka_python_murmur2(key) & 0xFFFFFFFF


def test_partition_for_key_is_positive_modulo():
    assert partition_for_key(b"foobar", 7) == (-790332482 & 0x7FFFFFFF) % 7


class Counting(random.Random):
    """Draws 0, 1, 2, ...: the n-th switch goes to partition n % partitions."""

    def __init__(self) -> None:
        super().__init__(0)
        self.n = -1

    def getrandbits(self, k: int) -> int:
        self.n += 1
        return self.n


def test_first_sticky_partition_is_random():
    firsts = {StickyPartitioner().partition("t", None, 8) for _ in range(40)}
    assert len(firsts) > 1   # all 40 on one partition: 8 chances in 8**40


def test_switches_after_a_batch_worth_of_bytes():
    # room for 10 records of 100 bytes in a batch: 10 records per partition, then the next
    p = StickyPartitioner(1000 + BATCH_OVERHEAD, rng=Counting())
    got = [p.partition("t", None, 3, 100) for _ in range(35)]
    assert got == [0] * 10 + [1] * 10 + [2] * 10 + [0] * 5
    other = [p.partition("u", None, 3, 100) for _ in range(3)]
    assert other == [1, 1, 1]   # a topic has its own stay (the fifth draw: 4 % 3)


def test_a_record_larger_than_a_batch_stays_alone():
    p = StickyPartitioner(1000 + BATCH_OVERHEAD, rng=Counting())
    assert [p.partition("t", None, 5, n) for n in (5000, 100, 950, 60)] == [0, 1, 2, 3]


def test_keys_choose_the_partition_unless_ignored():
    assert StickyPartitioner().partition("t", b"foobar", 7, 100) == partition_for_key(b"foobar", 7)
    p = StickyPartitioner(1000 + BATCH_OVERHEAD, ignore_keys=True, rng=Counting())
    assert {p.partition("t", b"k%d" % i, 7, 100) for i in range(10)} == {0}


def test_adaptive_draws_away_from_long_queues():
    queued = {"t": ([0, 10, 0, 10], [0, 1, 2, 3])}
    p = StickyPartitioner(1 + BATCH_OVERHEAD, load=lambda topic, n: queued[topic],
                          rng=random.Random(7))
    counts = Counter(p.partition("t", None, 4, 1) for _ in range(22000))
    # weights max + 1 - queued: 11, 1, 11, 1
    assert counts[0] + counts[2] > 5 * (counts[1] + counts[3]) > 0


def test_adaptive_leaves_out_partitions_without_a_leader():
    p = StickyPartitioner(1 + BATCH_OVERHEAD, load=lambda topic, n: ([3, 3], [1, 3]),
                          rng=random.Random(7))
    assert {p.partition("t", None, 4, 1) for _ in range(200)} == {1, 3}


def test_adaptive_with_equal_queues_is_uniform():
    p = StickyPartitioner(1 + BATCH_OVERHEAD, load=lambda topic, n: ([2, 2, 2], [0, 1, 2]),
                          rng=random.Random(7))
    counts = Counter(p.partition("t", None, 3, 1) for _ in range(3000))
    assert set(counts) == {0, 1, 2} and min(counts.values()) > 800


def test_partitioner_flags_are_checked():
    with pytest.raises(ConfigError, match="partitioner.ignore.keys"):
        AIOProducer({"bootstrap.servers": "127.0.0.1:1", "partitioner.ignore.keys": "maybe"})
    p = AIOProducer({"bootstrap.servers": "127.0.0.1:1", "partitioner.ignore.keys": "true",
                     "partitioner.adaptive.partitioning.enable": False})
    assert p.partitioner.ignore_keys and p.partitioner._load is None


def test_runs_of_records_are_partitioned_as_one_by_one():
    """sticky_runs (the Spark writer's columnar path) follows the rule of partition() exactly,
    and both continue the same stay."""
    from itertools import accumulate
    rng = random.Random(3)
    sizes = [rng.choice((40, 100, 700, 1500, 5000)) for _ in range(400)]
    one = StickyPartitioner(1000 + BATCH_OVERHEAD, rng=Counting())
    expected = [one.partition("t", None, 5, n) for n in sizes]
    runs = StickyPartitioner(1000 + BATCH_OVERHEAD, rng=Counting())
    got = []
    for part in (sizes[:150], sizes[150:151], sizes[151:]):   # calls continue the stay
        start = 0
        for partition, stop in runs.sticky_runs("t", 5, list(accumulate(part))):
            got += [partition] * (stop - start)
            start = stop
    assert got == expected
    assert runs.partition("t", None, 5, 40) == one.partition("t", None, 5, 40)
