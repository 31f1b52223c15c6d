"""buffer.memory back-pressure, max.block.ms, delivery.timeout.ms and acks against librdkafka's mock."""

import pytest

from oncelog.client import Producer
from oncelog.client.errors import BufferExhaustedError, DeliveryTimeoutError


def test_buffer_memory_blocks_then_delivers(rdkafka_mock):
    rdkafka_mock.create_topic("bm", 1)
    rdkafka_mock.set_rtt(1, 50)
    with Producer({"bootstrap.servers": rdkafka_mock.bootstrap, "buffer.memory": 40000,
                   "batch.size": 10000, "linger.ms": 0, "max.block.ms": 30000}) as p:
        futs = [p.send("bm", b"x" * 1000) for _ in range(300)]   # 300 KB through a 40 KB buffer
        assert p.aio.core.acc.used_bytes <= 40000 + 11000
        p.flush(60)
        assert [f.result(10).offset for f in futs] == list(range(300))


def test_max_block_ms_raises_buffer_exhausted(rdkafka_mock):
    rdkafka_mock.create_topic("bx", 1)
    with Producer({"bootstrap.servers": rdkafka_mock.bootstrap, "buffer.memory": 20000,
                   "batch.size": 10000, "max.block.ms": 300, "linger.ms": 0}) as p:
        p.send("bx", b"warm").result(10)
        rdkafka_mock.set_down(1)
        with pytest.raises(BufferExhaustedError, match="buffer.memory=20000"):
            for _ in range(100):
                p.send("bx", b"x" * 1000)
        rdkafka_mock.set_up(1)


def test_delivery_timeout_fails_records_then_producer_recovers(rdkafka_mock):
    rdkafka_mock.create_topic("dt", 1)
    with Producer({"bootstrap.servers": rdkafka_mock.bootstrap, "delivery.timeout.ms": 1500,
                   "request.timeout.ms": 500, "linger.ms": 0, "retry.backoff.ms": 50}) as p:
        p.send("dt", b"before").result(10)
        rdkafka_mock.set_down(1)
        lost = [p.send("dt", b"lost%d" % i) for i in range(3)]
        for f in lost:
            with pytest.raises(DeliveryTimeoutError, match="delivery.timeout.ms=1500"):
                f.result(30)
        rdkafka_mock.set_up(1)
        after = p.send("dt", b"after").result(30)
        assert after.offset is not None


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks(rdkafka_mock, acks):
    rdkafka_mock.create_topic("ak", 1)
    conf = {"bootstrap.servers": rdkafka_mock.bootstrap, "acks": acks}
    if acks == "0":
        conf["enable.idempotence"] = "off"
    with Producer(conf) as p:
        futs = [p.send("ak", b"%d" % i) for i in range(20)]
        p.flush(30)
        offs = [f.result(10).offset for f in futs]
    assert offs == ([None] * 20 if acks == "0" else list(range(20)))
