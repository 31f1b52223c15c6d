import os

from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from oncelog.client.partitioner import StickyPartitioner, murmur2, partition_for_key


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


def test_sticky_moves_on_new_batch():
    p = StickyPartitioner()
    first = p.partition("t", None, 3)
    assert p.partition("t", None, 3) == first
    p.on_new_batch("t", 3, first)
    assert p.partition("t", None, 3) != first
