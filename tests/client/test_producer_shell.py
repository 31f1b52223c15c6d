"""The asyncio shell and the synchronous facade against a real broker: close and fatal errors
resolve every record exactly once, flush waits for what was sent before it (callbacks included)
and only that, keyless records spread over partitions (KIP-794). Requests whose answers never
come are made by a fault proxy that keeps the broker's responses (the broker did the work; the
connection stays open)."""
import asyncio
import threading
import time
from collections import Counter

import pytest
from test_oncelog_broker import create

from oncelog.client import AdminClient, Producer
from oncelog.client.aio.producer import AIOProducer
from oncelog.client.errors import DataLossError, ProducerClosedError
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.fault_proxy import FaultConfig, ThreadedFaultProxy


def wait_for(cond, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def via(px: ThreadedFaultProxy, boot: str, **conf) -> dict:
    return {"bootstrap.servers": px.bootstrap, "oncelog.address.map": f"{boot}={px.bootstrap}",
            **{k.replace("_", "."): v for k, v in conf.items()}}


class Outcomes:
    """Counts every report per record: futures and callbacks."""

    def __init__(self) -> None:
        self.calls: Counter = Counter()
        self.errors: dict = {}
        self.futures: dict = {}
        self.lock = threading.Lock()

    def send(self, p: Producer, i: int, topic: str, **kw) -> None:
        def cb(err, meta, i=i):
            with self.lock:
                self.calls[i] += 1
                self.errors[i] = err
        self.futures[i] = p.send(topic, b"%d" % i, on_delivery=cb, **kw)

    def check_each_once(self) -> None:
        assert all(f.done() for f in self.futures.values()), \
            [i for i, f in self.futures.items() if not f.done()]
        assert set(self.calls) == set(self.futures), set(self.futures) - set(self.calls)
        assert set(self.calls.values()) == {1}, {i: n for i, n in self.calls.items() if n != 1}


# ------------------------------------------------------------------ close (item 3)

@pytest.mark.parametrize("idempotence", ["required", "off"])
@pytest.mark.parametrize("timeout", [0, 0.5])
def test_close_resolves_records_whose_answer_never_comes(shared_broker, unique_topic, idempotence,
                                                         timeout):
    boot = shared_broker.bootstrap
    create(boot, unique_topic)
    with ThreadedFaultProxy(boot) as px:
        p = Producer(via(px, boot, linger_ms=0, enable_idempotence=idempotence,
                         max_in_flight_requests_per_connection=2))
        p.partitions_for(unique_topic)
        out = Outcomes()
        px.hold()
        out.send(p, 0, unique_topic)
        wait_for(lambda: px.held >= 1, "the first request on the wire")
        for i in range(1, 40):
            out.send(p, i, unique_topic)
        if idempotence == "off":   # no one-at-a-time first batch: a second request goes out
            wait_for(lambda: px.held >= 2, "a second request on the wire")
        p.close(timeout)
        out.check_each_once()
        assert isinstance(out.errors[0], ProducerClosedError)
        assert "may or may not have been written" in str(out.errors[0])
        assert all(isinstance(e, ProducerClosedError) for e in out.errors.values())


@pytest.mark.processes
def test_close_after_a_fatal_error_resolves_records_on_the_wire(tmp_path):
    # the producer goes fatal (DataLossError: the broker really lost what it acknowledged, its
    # partition emptied while it was down) while a request to another partition is on the wire
    # and never answered
    b = BrokerProcess(tmp_path / "data").start()
    try:
        boot = b.bootstrap
        create(boot, "lost")
        create(boot, "other")
        with ThreadedFaultProxy(boot) as px:
            p = Producer(via(px, boot, linger_ms=0))
            for i in range(3):
                p.send("lost", b"%d" % i).result(30)
            p.partitions_for("other")
            b.kill()
            for segment in (tmp_path / "data" / "lost-0").glob("*.log"):
                segment.write_bytes(b"")
            b.start()
            out = Outcomes()
            px.hold()
            out.send(p, 0, "lost")
            wait_for(lambda: px.held == 1, "the request to `lost` on the wire")
            out.send(p, 1, "other")
            wait_for(lambda: px.held == 2, "the request to `other` on the wire")
            for i in range(2, 10):   # queued: the epoch's first batch to `other` goes alone
                out.send(p, i, "other")
            px.release(1)   # the broker's answer for `lost`: UNKNOWN_PRODUCER_ID -> fatal
            wait_for(lambda: p.aio.core.fatal is not None, "the fatal error")
            p.close(1)
            out.check_each_once()
            assert isinstance(out.errors[0], DataLossError)
            assert isinstance(out.errors[1], ProducerClosedError)   # on the wire, never answered
            assert all(isinstance(out.errors[i], DataLossError) for i in range(2, 10))   # queued
    finally:
        b.stop()


def test_close_without_timeout_delivers_everything(shared_broker, unique_topic):
    create(shared_broker.bootstrap, unique_topic)
    p = Producer({"bootstrap.servers": shared_broker.bootstrap, "linger.ms": 50})
    out = Outcomes()
    for i in range(500):
        out.send(p, i, unique_topic)
    p.close()
    out.check_each_once()
    assert set(out.errors.values()) == {None}
    assert sorted(f.result().offset for f in out.futures.values()) == list(range(500))


# ------------------------------------------------------------------ flush (item 6)

def test_flush_waits_only_for_records_sent_before_it(shared_broker, unique_topic):
    # a steady sender behind a slow link keeps the producer busy: flush must still return once
    # the records sent before it are complete, callbacks included
    boot = shared_broker.bootstrap
    create(boot, unique_topic)
    with ThreadedFaultProxy(boot, FaultConfig(latency_ms_up=10, latency_ms_down=10)) as px:
        with Producer(via(px, boot, linger_ms=1)) as p:
            p.partitions_for(unique_topic)
            out = Outcomes()
            for i in range(300):
                out.send(p, i, unique_topic)
            stop = threading.Event()

            def steady():
                while not stop.is_set():
                    p.send(unique_topic, b"later")
                    time.sleep(0.002)   # a rate, not a wait for state
            t = threading.Thread(target=steady)
            t.start()
            try:
                wait_for(lambda: p.aio.requests_sent > 0, "a request")
                p.flush(20)
                seen = dict(out.calls)   # what flush's caller sees on return
            finally:
                stop.set()
                t.join()
            assert len(seen) == 300 and set(seen.values()) == {1}
            assert all(f.done() for f in out.futures.values())


def test_concurrent_flushes_do_not_end_each_others_flushing(shared_broker, unique_topic):
    # a flush that gives up must not make a flush still waiting linger its records
    boot = shared_broker.bootstrap
    create(boot, unique_topic)

    async def main(px):
        p = await AIOProducer(via(px, boot, linger_ms=60000, delivery_timeout_ms=120000)).start()
        try:
            await p.ensure_topic(unique_topic)
            px.hold()
            f1 = await p.send(unique_topic, b"1")
            first = asyncio.ensure_future(p.flush(20))   # sends f1 at once (no lingering)
            while px.held < 1:
                await asyncio.sleep(0.01)
            f2 = await p.send(unique_topic, b"2")   # behind f1: the epoch's first batch goes alone
            second = asyncio.ensure_future(p.flush(20))
            await asyncio.sleep(0)   # one step: the second flush is waiting now
            with pytest.raises(asyncio.TimeoutError):
                await p.flush(0.2)   # a third one gives up
            px.hold(False)
            px.release()
            await first
            await second   # f2 went out without lingering 60 s
            assert (await f1).offset == 0 and (await f2).offset == 1
        finally:
            await p.close()
    with ThreadedFaultProxy(boot) as px:
        asyncio.run(main(px))


def test_flush_never_returns_before_the_callbacks_of_a_completed_batch(shared_broker, unique_topic):
    # a flush that runs after a response was handled, before the sender loop's next pass
    create(shared_broker.bootstrap, unique_topic)

    async def main():
        p = await AIOProducer({"bootstrap.servers": shared_broker.bootstrap, "linger.ms": 0}).start()
        try:
            await p.ensure_topic(unique_topic)
            called = []
            seen = []

            async def flush_and_look():
                await p.flush(20)
                seen.append((len(called), fut.done()))

            handle = p.sender.on_produce_done

            def flush_first(*args):
                # scheduled ahead of everything the response's handling wakes
                asyncio.ensure_future(flush_and_look())
                handle(*args)
            p.sender.on_produce_done = flush_first
            fut = await p.send(unique_topic, b"x", on_delivery=lambda err, meta: called.append(meta))
            await asyncio.wait_for(fut, 20)
            deadline = time.monotonic() + 20
            while not seen and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert seen == [(1, True)]
        finally:
            await p.close()
    asyncio.run(main())


# ------------------------------------------------------------------ partitioning (item 7)

def test_keyless_records_spread_a_batch_at_a_time(shared_broker, unique_topic):
    boot = shared_broker.bootstrap
    with AdminClient({"bootstrap.servers": boot}) as a:
        a.create_topics([unique_topic], num_partitions=4)[unique_topic].result()
    with Producer({"bootstrap.servers": boot}) as p:   # batch.size 16384
        futs = [p.send(unique_topic, bytes(100)) for _ in range(2000)]
        p.flush(60)
        parts = [f.result(10).partition for f in futs]
    assert len(set(parts)) >= 3, Counter(parts)
    # switching when a batch is full: every stay on a partition is whole batches
    per_batch = (16384 - 61) // (100 + 36)
    runs, start = [], 0
    for i in range(1, len(parts) + 1):
        if i == len(parts) or parts[i] != parts[i - 1]:
            runs.append(i - start)
            start = i
    assert all(r % per_batch == 0 for r in runs[:-1]), runs


def test_producers_start_on_different_partitions(shared_broker, unique_topic):
    boot = shared_broker.bootstrap
    with AdminClient({"bootstrap.servers": boot}) as a:
        a.create_topics([unique_topic], num_partitions=8)[unique_topic].result()
    first = set()
    for _ in range(4):
        with Producer({"bootstrap.servers": boot}) as p:
            first.add(p.send(unique_topic, b"x").result(30).partition)
    assert len(first) > 1   # all four on one partition: 1 chance in 512 with random starts
