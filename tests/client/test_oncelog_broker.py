"""The client against the real oncelog broker: KIP-1269's integration Test Plan, range mode,
UNKNOWN_PRODUCER_ID after retention vs without, old message formats and the idempotence modes,
exactly-once through connection resets. A delay proxy keeps requests in flight long enough for
the windows to fill (no timing is asserted)."""
import logging
import os
import sys
import time

import pytest

from oncelog.client import AdminClient, Consumer, Producer, TopicPartition
from oncelog.client.errors import DataLossError, IdempotenceUnsupportedError
from oncelog.client.types import TopicPartition as TP
from oncelog.testing.embedded import BrokerProcess, ServerProcess
from oncelog.testing.fault_proxy import FaultConfig, FaultProxyProcess, ThreadedFaultProxy

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """One default broker for the module's tests, which never restart or reconfigure it (each
    makes topics of its own)."""
    b = BrokerProcess(tmp_path_factory.mktemp("broker") / "data").start()
    yield b
    b.stop()


def create(boot, topic, partitions=1, **config):
    with AdminClient({"bootstrap.servers": boot}) as a:
        a.create_topics([topic], num_partitions=partitions,
                        config={k.replace("_", "."): str(v) for k, v in config.items()})[topic].result()


def via_proxy(boot, rtt_ms=30):
    px = FaultProxyProcess(boot, FaultConfig(latency_ms_up=rtt_ms / 2, latency_ms_down=rtt_ms / 2)).start()
    return px, {"bootstrap.servers": px.bootstrap, "oncelog.address.map": f"{boot}={px.bootstrap}"}


def cutting_proxy(boot):
    """Cuts each connection mid-request after 2-15 KB from the client: requests in flight are
    lost, processed or not, and the client must reconnect and retry."""
    return ThreadedFaultProxy(boot, FaultConfig(cut_after_bytes=(2000, 15000), seed=1)).start()


def read(boot, topic, partition=0, expected=None, timeout_s=30):
    tp = TopicPartition(topic, partition)
    with Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": boot}) as c:
        end = c.end_offsets([tp])[TopicPartition(topic, partition)]
        c.assign([TopicPartition(topic, partition, 0)])
        out = []
        deadline = time.monotonic() + timeout_s
        while (len(out) < (expected if expected is not None else end)) and time.monotonic() < deadline:
            out += c.poll(0.5)
        return out


def run(conf, sends, topic_for=lambda i: "t"):
    with Producer(conf) as p:
        futs = [p.send(topic_for(i), b"%06d" % i) for i in range(sends)]
        p.flush(120)
        metas = [f.result(30) for f in futs]
        core = p.aio.core
        seen = {tp.topic: ps.max_in_flight_seen for tp, ps in core.partitions.items()}
        windows = {tp.topic: ps.window for tp, ps in core.partitions.items()}
    return metas, seen, windows


BASE = {"batch.size": "1", "linger.ms": "0", "enable.idempotence": "required"}


# ------------------------------------------------------------------ KIP-1269 Test Plan

WINDOWS = {"w20": 20, "c1": 20, "c5": 5, "two5": 5, "two20": 20}


def stand_in(windows):
    """bench/inflight_broker.py: in memory, but deduplicating with oncelog's producer-state core
    and answering ProduceResponse v14 tag 1: the client-side numbers' broker in bench/inflight.py,
    held to the same KIP-1269 plan as `oncelog serve`."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "inflight_broker.py")
    return ServerProcess([sys.executable, path] + [a for t, w in windows.items() for a in ("--window", f"{t}={w}")])


@pytest.fixture(params=["oncelog", "standin"])
def kip_broker(request):
    if request.param == "standin":
        s = stand_in(WINDOWS).start()
        yield s
        s.kill()
        return
    b = request.getfixturevalue("oncelog_broker")()
    for topic, window in WINDOWS.items():
        create(b.bootstrap, topic, producer_state_batches_to_retain=window)
    yield b


def test_limits_discovered_from_produce_response(kip_broker):
    px, conf = via_proxy(kip_broker.bootstrap)
    try:
        metas, seen, windows = run({**conf, **BASE, "max.in.flight.requests.per.connection": 50},
                                   300, lambda i: "w20")
    finally:
        px.stop()
    assert windows["w20"] == 20
    assert 5 < seen["w20"] <= 20
    assert [m.offset for m in metas] == list(range(300))


def test_connection_limit_1_with_topic_window_20(kip_broker):
    px, conf = via_proxy(kip_broker.bootstrap)
    try:
        _, seen, windows = run({**conf, **BASE, "max.in.flight.requests.per.connection": 1}, 50,
                               lambda i: "c1")
    finally:
        px.stop()
    assert windows["c1"] == 20 and seen["c1"] == 1


def test_connection_limit_20_with_topic_window_5(kip_broker):
    px, conf = via_proxy(kip_broker.bootstrap)
    try:
        _, seen, windows = run({**conf, **BASE, "max.in.flight.requests.per.connection": 20}, 200,
                               lambda i: "c5")
    finally:
        px.stop()
    assert windows["c5"] == 5 and seen["c5"] == 5


def test_two_topics_with_different_windows_on_one_broker(kip_broker):
    px, conf = via_proxy(kip_broker.bootstrap)
    try:
        _, seen, windows = run({**conf, **BASE, "max.in.flight.requests.per.connection": 20}, 600,
                               lambda i: "two5" if i % 2 else "two20")
    finally:
        px.stop()
    assert windows == {"two5": 5, "two20": 20}
    assert seen["two5"] == 5 and 5 < seen["two20"] <= 20


def test_exactly_once_through_resets_with_window_20(kip_broker):
    """KAFKA-5494 under faults with 20 batches in flight: reported offsets are the log's."""
    proxy = cutting_proxy(kip_broker.bootstrap)
    try:
        conf = {"bootstrap.servers": proxy.bootstrap,
                "oncelog.address.map": f"{kip_broker.bootstrap}={proxy.bootstrap}",
                "batch.size": "1500", "linger.ms": "1", "max.in.flight.requests.per.connection": 20,
                "retry.backoff.ms": 5, "request.timeout.ms": 5000}
        metas, _, windows = run(conf, 5000, lambda i: "w20")
        assert proxy.stats.cuts >= 3 and windows["w20"] == 20
    finally:
        proxy.stop()
    offsets = [m.offset for m in metas]
    # every record got its own offset, in send order, with no hole: nothing written twice or lost
    assert offsets == list(range(5000))


def test_window_change_at_runtime_is_followed(broker):
    create(broker.bootstrap, "rt", producer_state_batches_to_retain=20)
    with Producer({"bootstrap.servers": broker.bootstrap, **BASE,
                   "max.in.flight.requests.per.connection": 50}) as p:
        p.send("rt", b"a").result(30)
        assert p.partition_window("rt", 0) == 20
        with AdminClient({"bootstrap.servers": broker.bootstrap}) as a:
            a.alter_configs("rt", {"producer.state.batches.to.retain": "7"})
        p.send("rt", b"b").result(30)
        assert p.partition_window("rt", 0) == 7


def test_new_connection_starts_the_window_at_5_until_the_broker_answers(broker):
    """KIP-1269 "Initial State": after a reconnect (the broker may have been replaced by an older
    one) the partition's window is 5 again, then rediscovered from the first answer."""
    create(broker.bootstrap, "nc", producer_state_batches_to_retain=20)
    with Producer({"bootstrap.servers": broker.bootstrap, **BASE}) as p:
        p.send("nc", b"a").result(30)
        assert p.partition_window("nc", 0) == 20
        core, seen = p.aio.core, []
        p.aio.cluster.on_connect.append(lambda node: seen.append(core.partition_state(TP("nc", 0)).window))
        for conn in list(p.aio.cluster.conns.values()):
            p.aio.loop.call_soon_threadsafe(conn.close)
        p.send("nc", b"b").result(30)
        assert seen and seen[0] == 5
        assert p.partition_window("nc", 0) == 20


def test_no_config_error_above_5_against_a_real_broker(broker):
    create(broker.bootstrap, "big")
    metas, _, windows = run({"bootstrap.servers": broker.bootstrap, "enable.idempotence": "true",
                             "max.in.flight.requests.per.connection": 1000}, 100, lambda i: "big")
    assert windows["big"] == 5 and [m.offset for m in metas] == list(range(100))


# ------------------------------------------------------------------ range mode (KIP-758)

def test_range_mode_threshold_learned_and_exactly_once(broker):
    create(broker.bootstrap, "rng", producer_state_dedup_mode="range")
    with Producer({"bootstrap.servers": broker.bootstrap, "max.in.flight.requests.per.connection": 100,
                   "batch.size": "2000", "linger.ms": "1"}) as p:
        futs = [p.send("rng", b"%06d" % i) for i in range(3000)]
        p.flush(60)
        [f.result(30) for f in futs]
        ps = p.aio.core.partition_state(TP("rng", 0))
        assert ps.max_inflight_sequences is not None and ps.max_inflight_sequences > 0
    assert [int(r.value) for r in read(broker.bootstrap, "rng", expected=3000)] == list(range(3000))


# ------------------------------------------------------------------ faults

def test_exactly_once_and_order_through_connection_resets(broker):
    """KAFKA-5494 under faults, window 20, against the real dedup."""
    create(broker.bootstrap, "rs", producer_state_batches_to_retain=20)
    proxy = cutting_proxy(broker.bootstrap)
    try:
        conf = {"bootstrap.servers": proxy.bootstrap, "oncelog.address.map": f"{broker.bootstrap}={proxy.bootstrap}",
                "batch.size": "1500", "linger.ms": "1", "max.in.flight.requests.per.connection": 20,
                "retry.backoff.ms": 5, "request.timeout.ms": 5000}
        metas, _, _ = run(conf, 5000, lambda i: "rs")
        assert proxy.stats.cuts >= 3
    finally:
        proxy.stop()
    recs = read(broker.bootstrap, "rs", expected=5000)
    assert [int(r.value) for r in recs] == list(range(5000)), "duplicate, gap or reorder"
    by_off = {r.offset: int(r.value) for r in recs}
    for i, m in enumerate(metas):
        assert m.offset is None or by_off[m.offset] == i


# ------------------------------------------------------------------ UNKNOWN_PRODUCER_ID

def wait_producer_expired(boot, topic, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    with AdminClient({"bootstrap.servers": boot}) as a:
        while a.describe_producers(topic, 0):
            if time.monotonic() > deadline:
                pytest.fail("producer state did not expire")
            time.sleep(0.1)


@pytest.fixture
def expiring_broker(oncelog_broker):
    return oncelog_broker({"producer.id.expiration.ms": "1000",
                           "producer.id.expiration.check.interval.ms": "100"})


def test_unknown_producer_after_retention_resets_and_retries(expiring_broker):
    boot = expiring_broker.bootstrap
    create(boot, "up")
    with Producer({"bootstrap.servers": boot, "linger.ms": 0}) as p:
        for i in range(3):
            p.send("up", b"%d" % i).result(30)
        with AdminClient({"bootstrap.servers": boot}) as a:
            a.delete_records({("up", 0): 3})
        wait_producer_expired(boot, "up")
        m = p.send("up", b"3").result(30)
        assert m.offset == 3
    assert [r.value for r in read(boot, "up", expected=1)] == [b"3"]


def test_idle_producer_past_expiry_continues_where_it_was(expiring_broker):
    # its batches are still in the log: the broker restores its state from them
    boot = expiring_broker.bootstrap
    create(boot, "idle")
    with Producer({"bootstrap.servers": boot, "linger.ms": 0}) as p:
        for i in range(3):
            p.send("idle", b"%d" % i).result(30)
        wait_producer_expired(boot, "idle")
        assert p.send("idle", b"3").result(30).offset == 3
    assert [r.value for r in read(boot, "idle", expected=4)] == [b"0", b"1", b"2", b"3"]


def test_idle_producer_forgotten_for_room_resets_instead_of_reporting_data_loss(expiring_broker):
    # The partition remembers no expired producer (a budget of 0 stands for a remembered set
    # overrun by producer churn): its state is forgotten with its batches still in the log. The
    # broker's UNKNOWN_PRODUCER_ID then carries the producer-state start as log start offset,
    # above what the producer had acknowledged: a reset, not a DataLossError.
    boot = expiring_broker.bootstrap
    create(boot, "churned", producer_state_max_remembered_producers_per_partition=0)
    with Producer({"bootstrap.servers": boot, "linger.ms": 0}) as p:
        for i in range(3):
            p.send("churned", b"%d" % i).result(30)
        wait_producer_expired(boot, "churned")
        assert p.send("churned", b"3").result(30).offset == 3
        assert p.send("churned", b"4").result(30).offset == 4
    assert [r.value for r in read(boot, "churned", expected=5)] == [b"0", b"1", b"2", b"3", b"4"]


def test_unknown_producer_after_real_loss_is_fatal_data_loss(tmp_path):
    # The broker really lost what it acknowledged (the partition's data gone, as after a disk
    # failure): UNKNOWN_PRODUCER_ID with a log start offset at or below the last acknowledged
    # offset, which the client must report. (An expired producer whose batches are still in the
    # log is restored by the broker and no longer gets here: see the test above.)
    from oncelog.testing.embedded import BrokerProcess
    b = BrokerProcess(tmp_path / "data").start()
    try:
        create(b.bootstrap, "ul")
        with Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0}) as p:
            for i in range(3):
                p.send("ul", b"%d" % i).result(30)
            b.kill()
            for segment in (tmp_path / "data" / "ul-0").glob("*.log"):
                segment.write_bytes(b"")
            b.start()
            with pytest.raises(DataLossError, match=r"ul-0.*log start offset 0.*offset 2"):
                p.send("ul", b"3").result(30)
    finally:
        b.stop()


# ------------------------------------------------------------------ old message formats

def test_requested_produces_plainly_to_an_old_format_topic(broker, caplog):
    create(broker.bootstrap, "fmt-old", message_format_version="0.10.2")
    create(broker.bootstrap, "fmt-new")
    with caplog.at_level(logging.WARNING, logger="oncelog.client"):
        with Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": "requested"}) as p:
            a = p.send("fmt-old", b"x").result(30)
            b = p.send("fmt-new", b"y").result(30)
            assert not p.aio.core.partition_state(TP("fmt-old", 0)).idempotent
            assert p.aio.core.partition_state(TP("fmt-new", 0)).idempotent
    assert a.offset == 0 and b.offset == 0
    assert "fmt-old" in caplog.text and "without idempotence" in caplog.text


def test_required_refuses_an_old_format_topic_clearly(broker):
    create(broker.bootstrap, "fmt-old2", message_format_version="0.10.2")
    with Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": "required"}) as p:
        with pytest.raises(IdempotenceUnsupportedError, match="fmt-old2.*v2"):
            p.send("fmt-old2", b"x").result(30)


# ------------------------------------------------------------------ consumer

def test_consumer_offsets_seek_and_times(broker):
    create(broker.bootstrap, "cons", partitions=2)
    with Producer({"bootstrap.servers": broker.bootstrap}) as p:
        metas = [p.send("cons", b"v%d" % i, partition=i % 2, timestamp=1000 + i).result(30)
                 for i in range(20)]
    tps = [TopicPartition("cons", 0), TopicPartition("cons", 1)]
    with Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": broker.bootstrap}) as c:
        assert c.beginning_offsets(tps) == {tps[0]: 0, tps[1]: 0}
        assert c.end_offsets(tps) == {tps[0]: 10, tps[1]: 10}
        assert c.offsets_for_times({tps[0]: 1010})[tps[0]] == 5
        c.assign([TopicPartition("cons", 0, 0)])
        c.seek(tps[0], 7)
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 3 and time.monotonic() < deadline:
            got += c.poll(0.5)
        assert [(r.offset, r.value) for r in got] == [(7, b"v14"), (8, b"v16"), (9, b"v18")]
        assert got[0].timestamp == 1014
    assert metas[14].offset == 7


# ------------------------------------------------------------------ batch-level entry points

def test_threads_sending_at_once_each_keep_order_and_nothing_doubles(broker):
    """Sends from other threads go through the handoff to the loop thread; with four threads
    and a small buffer.memory (so senders also wait for memory), every record lands once and
    each thread's records keep their order."""
    import threading
    create(broker.bootstrap, "threads")
    per = 3000
    with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": "2", "batch.size": "4096",
                   "buffer.memory": "65536", "enable.idempotence": "required"}) as p:
        futs: dict[int, list] = {}

        def sender(t):
            futs[t] = [p.send("threads", b"%d-%06d" % (t, i)) for i in range(per)]
        threads = [threading.Thread(target=sender, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        p.flush(120)
        offsets = [f.result(30).offset for t in range(4) for f in futs[t]]
    assert len(set(offsets)) == 4 * per
    got = read(broker.bootstrap, "threads", expected=4 * per)
    assert len(got) == 4 * per
    for t in range(4):
        mine = [r.value for r in got if r.value.startswith(b"%d-" % t)]
        assert mine == [b"%d-%06d" % (t, i) for i in range(per)]
    for t in range(4):
        assert [f.result().offset for f in futs[t]] == sorted(f.result().offset for f in futs[t])


def test_send_encoded_batches_get_sequences_and_read_back(broker):
    from oncelog.protocol.records import encode_record
    create(broker.bootstrap, "encoded", partitions=2)
    with Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": "required"}) as p:
        p.send("encoded", b"before", partition=1)
        futs = []
        for b in range(5):
            records = b"".join(encode_record(i, i, b"k", b"%d-%d" % (b, i)) for i in range(100))
            futs.append(p.send_encoded("encoded", 1, records, 100, base_timestamp=1000 + b,
                                       max_timestamp=1099 + b))
        p.send("encoded", b"after", partition=1)
        metas = [f.result(30) for f in futs]
        assert p.partitions_for("encoded") == 2
    assert [m.base_offset for m in metas] == [1 + 100 * b for b in range(5)]
    assert all(m.count == 100 and m.partition == 1 for m in metas)
    got = read(broker.bootstrap, "encoded", partition=1, expected=502)
    assert [r.value for r in got] == ([b"before"] + [b"%d-%d" % (b, i) for b in range(5)
                                                     for i in range(100)] + [b"after"])
    assert got[1].timestamp == 1000 and got[100].timestamp == 1099


def test_poll_raw_returns_whole_batches_and_moves_past_them(broker):
    from oncelog.protocol.records import decode_records
    create(broker.bootstrap, "raw")
    with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": "0"}) as p:
        for i in range(50):
            p.send("raw", b"%d" % i)
            if i % 10 == 9:
                p.flush()
    tp = TopicPartition("raw", 0)
    with Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": broker.bootstrap}) as c:
        c.assign([TopicPartition("raw", 0, 25)])
        records = []
        deadline = time.monotonic() + 20
        while c.position(tp) < 50 and time.monotonic() < deadline:
            for got_tp, fetched_from, data in c.poll_raw(0.5):
                assert got_tp == tp
                records += [r for r in decode_records(data) if r.offset >= fetched_from]
        assert c.position(tp) == 50
    assert [r.value for r in records] == [b"%d" % i for i in range(25, 50)]


def test_produce_send_and_async_send_report_each_record_once(broker):
    """produce (callback only), send (future, with or without a callback) and the asyncio
    producer's send land in the same batches; each record is reported once, with the offset
    it was read back at, and each partition keeps the order of sending."""
    create(broker.bootstrap, "mixed", partitions=3)
    reports: dict[bytes, list] = {}

    def cb(err, meta, value):
        reports.setdefault(value, []).append((err, meta))
    futures = {}
    with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": "20",
                   "enable.idempotence": "required"}) as p:
        for i in range(600):
            v = b"%04d" % i
            kind = i % 4
            if kind == 0:
                assert p.produce("mixed", v, key=b"k%d" % (i % 5), partition=-1, timestamp=0,
                                 on_delivery=lambda e, m, v=v: cb(e, m, v)) is None
            elif kind == 1:
                futures[v] = p.send("mixed", v, partition=i % 3,
                                    on_delivery=lambda e, m, v=v: cb(e, m, v))
            elif kind == 2:
                futures[v] = p.send("mixed", v, partition=i % 3)
            else:
                futures[v] = p._lt.run(p.aio.send("mixed", v, partition=i % 3,
                                                  on_delivery=lambda e, m, v=v: cb(e, m, v)))
        p.flush(60)
    got = {(r.value): (tp, r.offset) for tp in range(3)
           for r in read(broker.bootstrap, "mixed", partition=tp)}
    assert len(got) == 600
    for i in range(600):
        v = b"%04d" % i
        partition, offset = got[v]
        if i % 4 != 2:
            (err, meta), = reports[v]   # exactly once
            assert err is None and (meta.partition, meta.offset) == (partition, offset)
        if v in futures:
            meta = futures[v].result()   # done: flushed
            assert (meta.partition, meta.offset) == (partition, offset)
    for tp in range(3):
        values = [r.value for r in read(broker.bootstrap, "mixed", partition=tp)]
        assert values == sorted(values)


def test_records_failed_at_close_reach_their_callbacks_and_futures(broker):
    create(broker.bootstrap, "closing")
    errors = []
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": "600000",
                  "batch.size": "1000000", "enable.idempotence": "required"})
    for i in range(20):
        p.produce("closing", b"%d" % i, on_delivery=lambda e, m: errors.append((e, m)))
    futs = [p.send("closing", b"s%d" % i) for i in range(20)]
    p.close(0)
    assert len(errors) == 20 and all(e is not None and m is None for e, m in errors)
    assert all(f.exception(0) is not None for f in futs)


def test_sends_racing_close_are_each_delivered_or_failed(broker):
    """Threads keep sending while another closes the producer: every send either raises
    ProducerClosedError or returns a future that is done once close() returns (a record handed
    over just after close() took the handoff is failed by its sender)."""
    import threading

    from oncelog.client.errors import ProducerClosedError
    create(broker.bootstrap, "racing")
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": "50",
                  "enable.idempotence": "required"})
    futures: list[list] = [[] for _ in range(4)]

    def sender(t):
        try:
            while True:
                futures[t].append(p.send("racing", b"%d" % t))
        except ProducerClosedError:
            pass
    threads = [threading.Thread(target=sender, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + 30
    while min(len(f) for f in futures) < 2000:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    p.close(10)
    for th in threads:
        th.join(30)
    assert not any(th.is_alive() for th in threads)
    everything = [f for fs in futures for f in fs]
    assert all(f.done() for f in everything)
    failed = [f.exception() for f in everything if f.exception() is not None]
    assert all(isinstance(e, ProducerClosedError) for e in failed)
    # the interleaving the threads rarely hit, forced: a sender that passed the closing check
    # before close() began hands its record over after close() took the handoff
    from oncelog.client.futures import new_record_future
    late = new_record_future()
    assert p.aio.handoff.hand_over(p.aio.metadata.tp("racing", 0), 0, None, b"late", None, late, 40)
    assert isinstance(late.exception(0), ProducerClosedError)
