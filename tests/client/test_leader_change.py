"""KIP-1269: leader change from a broker that retains 20 batches to one without the field (an
"old" broker that retains 5). Two listeners of the stand-in broker (bench/inflight_broker.py) share
the partition and its producer state (oncelog's core), as brokers on one machine share a
directory; node 2 behaves like a pre-KIP-1269 broker."""
import asyncio
import importlib.util
import os
import threading
import time

import pytest

from oncelog.client import Producer
from oncelog.client.types import TopicPartition as TP
from oncelog.testing.fault_proxy import FaultConfig, FaultProxyProcess

pytestmark = pytest.mark.processes

_spec = importlib.util.spec_from_file_location(
    "inflight_broker", os.path.join(os.path.dirname(__file__), "..", "..", "bench", "inflight_broker.py"))
standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(standin)


@pytest.fixture
def two_node_standin():
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    b = standin.StandInBroker(None, {"lc": 20})
    a1 = asyncio.run_coroutine_threadsafe(b.start_node(1), loop).result(5)
    a2 = asyncio.run_coroutine_threadsafe(b.start_node(2, old=True), loop).result(5)
    delay = FaultConfig(latency_ms_up=8, latency_ms_down=8)
    proxies = [FaultProxyProcess(f"{a[0]}:{a[1]}", delay).start() for a in (a1, a2)]
    amap = ",".join(f"{a[0]}:{a[1]}={p.bootstrap}" for a, p in zip((a1, a2), proxies))
    try:
        yield b, loop, {"bootstrap.servers": proxies[0].bootstrap, "oncelog.address.map": amap}
    finally:
        for p in proxies:
            p.stop()
        loop.call_soon_threadsafe(loop.stop)
        t.join(5)


def wait_for(cond, what, timeout_s=20):
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_window_reset_to_5_on_move_to_old_broker_and_not_exceeded(two_node_standin):
    broker, loop, conf = two_node_standin
    with Producer({**conf, "batch.size": 1, "linger.ms": 0,
                   "max.in.flight.requests.per.connection": 50}) as p:
        first = [p.send("lc", b"%05d" % i) for i in range(300)]
        p.flush(60)
        ps = p.aio.core.partition_state(TP("lc", 0))
        assert ps.window == 20 and 5 < ps.max_in_flight_seen <= 20
        loop.call_soon_threadsafe(broker.move_leader, "lc", 2)
        # the producer notices the move at its next metadata refresh
        p._lt.loop.call_soon_threadsafe(p.aio.cluster.request_refresh)
        wait_for(lambda: ps.leader == 2, "the producer to see the new leader")
        assert ps.window == 5
        with p.aio.lock:
            ps.max_in_flight_seen = 0
        second = [p.send("lc", b"%05d" % i) for i in range(300, 600)]
        p.flush(60)
        assert ps.window == 5                 # node 2 sends no ProducerStateBatchesToRetain
        assert 0 < ps.max_in_flight_seen <= 5
        offsets = [f.result(10).offset for f in first + second]
    assert offsets == list(range(600))


def test_move_while_producing_keeps_every_record_once_in_order(two_node_standin):
    broker, loop, conf = two_node_standin
    with Producer({**conf, "batch.size": 200, "linger.ms": 1, "retry.backoff.ms": 5,
                   "max.in.flight.requests.per.connection": 20}) as p:
        futs = [p.send("lc", b"%05d" % i) for i in range(200)]
        wait_for(lambda: sum(f.done() for f in futs) >= 20, "the first acknowledgements")
        loop.call_soon_threadsafe(broker.move_leader, "lc", 2)
        futs += [p.send("lc", b"%05d" % i) for i in range(200, 2000)]
        p.flush(60)
        offsets = [f.result(10).offset for f in futs]
        assert p.aio.core.partition_state(TP("lc", 0)).leader == 2
    assert offsets == list(range(2000))
