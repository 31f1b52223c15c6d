"""The oncelog client against brokers that know nothing of KIP-1269: librdkafka's mock cluster
and Tansu. The per-partition window must stay at 5 and every record must land once, in order."""
import pytest

from oncelog.client import Consumer, Producer, TopicPartition
from oncelog.protocol.errors import ErrorCode as E

PRODUCE = 0


def read_all(boot, topic, partitions, expected, timeout_s=30):
    import time
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    out = {p: [] for p in range(partitions)}
    with Consumer({"bootstrap.servers": boot, "auto.offset.reset": "earliest"}) as c:
        c.assign(tps)
        deadline = time.monotonic() + timeout_s
        while sum(len(v) for v in out.values()) < expected and time.monotonic() < deadline:
            for r in c.poll(0.5):
                out[r.partition].append(r)
        # read a little longer: anything beyond `expected` is a duplicate
        for r in c.poll(0.5):
            out[r.partition].append(r)
    return out


def produce_numbered(boot, topic, n, **cfg):
    conf = {"bootstrap.servers": boot, "linger.ms": 2, "batch.size": 2000,
            "max.in.flight.requests.per.connection": 20, "enable.idempotence": "required"}
    conf.update(cfg)
    with Producer(conf) as p:
        futs = [p.send(topic, b"%06d" % i + b"x" * 100, key=b"k%d" % (i % 7)) for i in range(n)]
        p.flush(60)
        metas = [f.result(30) for f in futs]
        windows = {m.partition: p.partition_window(topic, m.partition) for m in metas}
        seen = {m.partition: p.aio.max_in_flight_seen(topic, m.partition) for m in metas}
    return metas, windows, seen


def check_exactly_once(out, metas, n, ordered=True):
    values = [r.value[:6] for recs in out.values() for r in recs]
    assert len(values) == n, f"{len(values)} records read, {n} sent"
    assert len(set(values)) == n
    for p, recs in out.items():
        if not ordered:
            continue
        nums = [int(r.value[:6]) for r in recs]
        assert nums == sorted(nums), f"order broken in partition {p}"
        assert [r.offset for r in recs] == list(range(recs[0].offset, recs[0].offset + len(recs))) if recs else True
    by_value = {(r.partition, r.offset): int(r.value[:6]) for recs in out.values() for r in recs}
    for i, m in enumerate(metas):
        assert by_value[(m.partition, m.offset)] == i, "reported offset does not hold the record"


def test_librdkafka_mock_window_stays_5_and_exactly_once(rdkafka_mock):
    rdkafka_mock.create_topic("fm", 3)
    metas, windows, seen = produce_numbered(rdkafka_mock.bootstrap, "fm", 3000)
    assert set(windows.values()) == {5}
    assert max(seen.values()) <= 5
    check_exactly_once(read_all(rdkafka_mock.bootstrap, "fm", 3, 3000), metas, 3000)


ERRORS = (0, 0, E.NOT_LEADER_OR_FOLLOWER, E.NOT_ENOUGH_REPLICAS, 0, E.REQUEST_TIMED_OUT, 0,
          E.NOT_LEADER_OR_FOLLOWER, 0)


def test_librdkafka_mock_no_loss_no_duplicate_under_injected_errors(rdkafka_mock):
    """Retriable errors (nothing appended) in the middle of a pipelined stream: every record is
    delivered once. Order is NOT checked here: the mock does no sequence checks for
    non-transactional producers and appends the in-flight batches after a refused one, which a
    real broker answers with OutOfOrderSequence (reference/clients.md A3); ordering under
    injected errors is checked against the model broker and the oncelog broker."""
    rdkafka_mock.create_topic("fe", 1)
    boot = rdkafka_mock.bootstrap
    rdkafka_mock.push_errors(PRODUCE, *ERRORS)
    metas, windows, _ = produce_numbered(boot, "fe", 2000, **{"retry.backoff.ms": 5, "batch.size": 500})
    check_exactly_once(read_all(boot, "fe", 1, 2000), metas, 2000, ordered=False)


def test_librdkafka_mock_order_kept_under_injected_errors_with_one_in_flight(rdkafka_mock):
    rdkafka_mock.create_topic("fe1", 1)
    boot = rdkafka_mock.bootstrap
    rdkafka_mock.push_errors(PRODUCE, *ERRORS)
    metas, _, _ = produce_numbered(boot, "fe1", 1000, **{
        "retry.backoff.ms": 5, "batch.size": 500, "max.in.flight.requests.per.connection": 1})
    check_exactly_once(read_all(boot, "fe1", 1, 1000), metas, 1000)


def test_librdkafka_mock_leader_move_resets_window_and_delivers(rdkafka_mock3):
    mc = rdkafka_mock3
    mc.create_topic("fl", 1, 3)
    boot = mc.bootstrap
    conf = {"bootstrap.servers": boot, "linger.ms": 1, "enable.idempotence": "required",
            "max.in.flight.requests.per.connection": 20, "retry.backoff.ms": 10}
    with Producer(conf) as p:
        futs = [p.send("fl", b"%06d" % i) for i in range(500)]
        p.flush(30)
        from oncelog.client.types import TopicPartition as TP
        ps = p.aio.core.partition_state(TP("fl", 0))
        old_leader = ps.leader
        new_leader = 1 if old_leader != 1 else 2
        mc.set_leader("fl", 0, new_leader)
        futs += [p.send("fl", b"%06d" % i) for i in range(500, 1000)]
        p.flush(60)
        metas = [f.result(30) for f in futs]
        assert ps.leader == new_leader
        assert ps.window == 5
    check_exactly_once(read_all(boot, "fl", 1, 1000), metas, 1000)


def test_tansu_window_stays_5_and_exactly_once(tansu):
    from oncelog.client import AdminClient
    with AdminClient({"bootstrap.servers": tansu}) as a:
        a.create_topics(["ft"], num_partitions=2)["ft"].result()
    metas, windows, seen = produce_numbered(tansu, "ft", 3000)
    assert set(windows.values()) == {5}
    assert max(seen.values()) <= 5
    check_exactly_once(read_all(tansu, "ft", 2, 3000), metas, 3000)


@pytest.mark.parametrize("mode", ["requested", "required", "off"])
def test_tansu_idempotence_modes(tansu, mode):
    """Tansu offers InitProducerId: every mode produces; off sends no producer id."""
    from oncelog.client import AdminClient
    topic = f"fmode-{mode}"
    with AdminClient({"bootstrap.servers": tansu}) as a:
        a.create_topics([topic])[topic].result()
    metas, _, _ = produce_numbered(tansu, topic, 200, **{"enable.idempotence": mode})
    check_exactly_once(read_all(tansu, topic, 1, 200), metas, 200)


def test_tansu_exactly_once_and_order_through_connection_resets(tansu):
    """KAFKA-5494 under faults: connections cut mid-request (some requests written, some not,
    answers lost); with 20 requests allowed per connection the producer reconnects, retries in
    sequence order, and the log holds every record once, in order. Tansu answers replays with
    DUPLICATE_SEQUENCE_NUMBER, so those records report offset None."""
    from oncelog.client import AdminClient
    from oncelog.testing.fault_proxy import FaultConfig, ThreadedFaultProxy
    with AdminClient({"bootstrap.servers": tansu}) as a:
        a.create_topics(["fr"], num_partitions=1)["fr"].result()
    proxy = ThreadedFaultProxy(tansu, FaultConfig(cut_after_bytes=(20000, 120000), seed=1)).start()
    try:
        n = 4000
        conf = {"bootstrap.servers": proxy.bootstrap, "oncelog.address.map": f"{tansu}={proxy.bootstrap}",
                "linger.ms": 2, "batch.size": 3000, "max.in.flight.requests.per.connection": 20,
                "enable.idempotence": "required", "retry.backoff.ms": 5, "request.timeout.ms": 5000}
        with Producer(conf) as p:
            futs = [p.send("fr", b"%06d" % i + b"y" * 200) for i in range(n)]
            p.flush(120)
            metas = [f.result(30) for f in futs]
        assert proxy.stats.cuts >= 3
    finally:
        proxy.stop()
    out = read_all(tansu, "fr", 1, n)
    values = [int(r.value[:6]) for r in out[0]]
    assert values == list(range(n)), "duplicate, gap or reorder"
    offsets = {r.offset: int(r.value[:6]) for r in out[0]}
    for i, m in enumerate(metas):
        assert m.offset is None or offsets[m.offset] == i


def test_kip360_bump_after_out_of_order_on_next_batch(rdkafka_mock, caplog):
    """OutOfOrderSequence on the batch right after the last acknowledged one: the producer bumps
    its epoch itself (KIP-360, as Kafka's idempotent producer does; no InitProducerId), renumbers
    from 0 and delivers; a warning names the partition and the last acknowledged offset."""
    import logging
    rdkafka_mock.create_topic("k360", 1)
    boot = rdkafka_mock.bootstrap
    with Producer({"bootstrap.servers": boot, "linger.ms": 0, "enable.idempotence": "required"}) as p:
        first = [p.send("k360", b"%06d" % i).result(10) for i in range(5)]
        pid = p.aio.core.producer_id
        rdkafka_mock.push_errors(PRODUCE, E.OUT_OF_ORDER_SEQUENCE_NUMBER)
        with caplog.at_level(logging.WARNING, logger="oncelog.client"):
            later = [p.send("k360", b"%06d" % i) for i in range(5, 10)]
            p.flush(30)
            later = [f.result(10) for f in later]
        assert (p.aio.core.producer_id, p.aio.core.producer_epoch) == (pid, 1)
    assert "k360-0" in caplog.text and "last acknowledged" in caplog.text and "offset 4" in caplog.text
    assert [m.offset for m in first + later] == list(range(10))
    check_exactly_once(read_all(boot, "k360", 1, 10), first + later, 10)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_round_trip(tansu, codec):
    from oncelog.client import AdminClient
    topic = f"fc-{codec}"
    with AdminClient({"bootstrap.servers": tansu}) as a:
        a.create_topics([topic])[topic].result()
    metas, _, _ = produce_numbered(tansu, topic, 500, **{"compression.type": codec})
    check_exactly_once(read_all(tansu, topic, 1, 500), metas, 500)
