"""The proxy against a tiny Kafka-framed echo server (the proxy's own unit; the broker-facing
runs are in tests/verify)."""
import asyncio
import socket
import struct
import threading
import time

import pytest

from oncelog.protocol import headers, produce
from oncelog.protocol.api import ApiKey
from oncelog.testing.fault_proxy import FaultConfig, FaultProxy, FaultProxyProcess, ThreadedFaultProxy, _produce_acks
from oncelog.testing.late_endtxn import transactional_id


class EchoServer:
    """Answers each request frame with a frame holding its correlation id (or, `whole`, with the
    frame itself); counts what it did and the bytes of requests it never got whole."""

    def __init__(self, whole=False, tails=None):
        self.processed = []
        self.whole = whole
        self.partial = []
        self.tails = tails or {}   # api key -> what its answers carry after the correlation id

    async def start(self):
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        h, p = self.server.sockets[0].getsockname()[:2]
        return f"{h}:{p}"

    async def _handle(self, r, w):
        try:
            while True:
                (size,) = struct.unpack(">i", await r.readexactly(4))
                body = await r.readexactly(size)
                api_key, _ver, corr = struct.unpack_from(">hhi", body)
                self.processed.append((api_key, corr))
                tail = self.tails.get(api_key, b"")
                answer = struct.pack(">ii", 4 + len(tail), corr) + tail
                w.write(struct.pack(">i", size) + body if self.whole else answer)
                await w.drain()
        except asyncio.IncompleteReadError as e:
            if e.partial:
                self.partial.append(len(e.partial))
            w.close()
        except ConnectionError:
            w.close()

    async def stop(self):
        self.server.close()


def request(api_key, corr, version=3):
    # header v1: key, version, corr, client id "t"; Produce v3: txn id null, acks=-1
    body = struct.pack(">hhih", api_key, version, corr, 1) + b"t"
    if api_key == 0:
        body += struct.pack(">hh", -1, -1) + b"rest"
    return struct.pack(">i", len(body)) + body


async def roundtrip(bootstrap, frames):
    h, p = bootstrap.rsplit(":", 1)
    r, w = await asyncio.open_connection(h, int(p))
    got = []
    try:
        for f in frames:
            w.write(f)
            await w.drain()
            head = await r.readexactly(4)
            got.append(struct.unpack_from(">i", await r.readexactly(struct.unpack(">i", head)[0]))[0])
    except (asyncio.IncompleteReadError, ConnectionError):
        got.append("closed")
    w.close()
    return got


@pytest.fixture
async def echo():
    s = EchoServer()
    addr = await s.start()
    yield s, addr
    await s.stop()


async def test_passes_frames_through(echo):
    server, addr = echo
    proxy = FaultProxy(addr)
    await proxy.start()
    try:
        assert await roundtrip(proxy.bootstrap, [request(3, 1), request(0, 2)]) == [1, 2]
        assert proxy.stats.requests == {3: 1, 0: 1}
    finally:
        await proxy.stop()


async def test_delays_each_direction(echo):
    server, addr = echo
    proxy = FaultProxy(addr, FaultConfig(latency_ms_up=60, latency_ms_down=60))
    await proxy.start()
    try:
        t0 = time.monotonic()
        assert await roundtrip(proxy.bootstrap, [request(3, 7)]) == [7]
        assert time.monotonic() - t0 >= 0.12  # a lower bound the sleeps guarantee
    finally:
        await proxy.stop()


async def test_reset_closes_before_the_broker_sees_the_request(echo):
    server, addr = echo
    proxy = FaultProxy(addr, FaultConfig(reset_probability=1.0))
    await proxy.start()
    try:
        assert await roundtrip(proxy.bootstrap, [request(0, 1)]) == ["closed"]
        assert server.processed == [] and proxy.stats.resets == 1
    finally:
        await proxy.stop()


async def test_drop_response_after_broker_processed(echo):
    server, addr = echo
    proxy = FaultProxy(addr, FaultConfig(drop_response_probability=1.0))
    await proxy.start()
    try:
        # Metadata-like requests are not dropped, Produce responses are
        assert await roundtrip(proxy.bootstrap, [request(3, 1), request(0, 2)]) == [1, "closed"]
        deadline = time.monotonic() + 5
        while (0, 2) not in server.processed and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert (0, 2) in server.processed  # written but not acknowledged
        assert proxy.stats.dropped_responses == 1
    finally:
        await proxy.stop()


async def test_hold_keeps_answers_in_order_until_released(echo):
    server, addr = echo
    proxy = FaultProxy(addr)
    await proxy.start()
    try:
        h, p = proxy.bootstrap.rsplit(":", 1)
        r, w = await asyncio.open_connection(h, int(p))
        proxy.hold()
        for frame in (request(0, 1), request(3, 2), request(0, 3)):
            w.write(frame)   # the Metadata answer waits behind the held Produce answer
        await w.drain()
        deadline = time.monotonic() + 5
        while proxy.held < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert proxy.held == 3 and len(server.processed) == 3   # done, not answered

        async def answer():
            head = await r.readexactly(4)
            return struct.unpack(">i", await r.readexactly(struct.unpack(">i", head)[0]))[0]
        proxy.release(1)
        assert await answer() == 1 and proxy.held == 2
        proxy.hold(False)
        proxy.release()
        assert [await answer(), await answer()] == [2, 3]
        w.close()
    finally:
        await proxy.stop()


async def test_same_seed_same_fault_schedule(echo):
    server, addr = echo

    async def schedule(seed):
        proxy = FaultProxy(addr, FaultConfig(reset_probability=0.3, seed=seed))
        await proxy.start()
        out = []
        try:
            for i in range(20):
                out.append(await roundtrip(proxy.bootstrap, [request(3, i)]))
        finally:
            await proxy.stop()
        return out

    a, b, c = await schedule(5), await schedule(5), await schedule(6)
    assert a == b and ["closed"] in a and a != c



def test_threaded_proxy_roundtrip():
    async def main():
        s = EchoServer()
        addr = await s.start()
        return s, addr

    loop = asyncio.new_event_loop()
    import threading
    server, addr = loop.run_until_complete(main())
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        with ThreadedFaultProxy(addr, FaultConfig(reset_probability=1.0)) as p:
            got = asyncio.run(roundtrip(p.bootstrap, [request(0, 1)]))
            assert got == ["closed"] and p.stats.resets == 1
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join(5)


async def test_frames_in_flight_overlap_their_delays(echo):
    # five requests written at once are all read by the proxy before the first one is due at
    # the broker: a delay per frame in turn would hold the second until the first went out
    server, addr = echo
    proxy = FaultProxy(addr, FaultConfig(latency_ms_up=1000))
    await proxy.start()
    try:
        h, p = proxy.bootstrap.rsplit(":", 1)
        r, w = await asyncio.open_connection(h, int(p))
        w.write(b"".join(request(3, i) for i in range(5)))
        await w.drain()
        deadline = time.monotonic() + 5
        while sum(proxy.stats.requests.values()) < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert sum(proxy.stats.requests.values()) == 5 and server.processed == []
        answers = []
        for _ in range(5):
            head = await r.readexactly(4)
            answers.append(struct.unpack(">i", await r.readexactly(struct.unpack(">i", head)[0]))[0])
        assert answers == [0, 1, 2, 3, 4]
        w.close()
    finally:
        await proxy.stop()


async def test_cut_forwards_part_of_a_request_then_closes(echo):
    server, addr = echo
    proxy = FaultProxy(addr, FaultConfig(cut_after_bytes=(20, 20)))
    await proxy.start()
    try:
        # requests of 15 bytes: the second crosses 20 bytes, half of it reaches the broker
        assert await roundtrip(proxy.bootstrap, [request(3, 1), request(3, 2)]) == [1, "closed"]
        deadline = time.monotonic() + 5
        while not server.partial and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert server.processed == [(3, 1)] and server.partial == [(len(request(3, 2)) // 2) - 4]
        assert proxy.stats.cuts == 1
    finally:
        await proxy.stop()


@pytest.fixture
def echo_thread():
    """A framed echo server (`whole`) on a loop of its own, for the synchronous facades."""
    loop = asyncio.new_event_loop()
    server = EchoServer(whole=True)
    addr = loop.run_until_complete(server.start())
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    yield server, addr
    loop.call_soon_threadsafe(loop.stop)
    t.join(5)


@pytest.mark.processes
def test_proxy_process_forwards_frames_in_order(echo_thread):
    _server, addr = echo_thread
    frames = [struct.pack(">i", 8 + n) + struct.pack(">hhi", 3, 0, i) + bytes([i % 256]) * n
              for i, n in enumerate([0, 1, 70_000, 5, 300_000, 2, 16_384] * 3)]
    with FaultProxyProcess(addr, FaultConfig(latency_ms_up=10, latency_ms_down=10)) as px:
        host, port = px.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as s:
            t0 = time.monotonic()
            s.sendall(b"".join(frames))
            want = sum(map(len, frames))
            got = bytearray()
            while len(got) < want:
                chunk = s.recv(1 << 20)
                assert chunk, "closed"
                got += chunk
            assert time.monotonic() - t0 >= 0.02   # a lower bound the delays guarantee
    assert bytes(got) == b"".join(frames)



@pytest.mark.parametrize("version", [3, 9])
@pytest.mark.parametrize("acks", [0, -1])
def test_reads_the_acks_of_a_produce_frame(version, acks):
    # an acks=0 Produce gets no answer: the proxy must not wait for one (v9+: flexible header)
    body = (headers.request_header(ApiKey.PRODUCE, version, 5, "client")
            + produce.encode_request(version, acks, 1000, {"t": [(0, b"R")]}, transactional_id="tx"))
    assert _produce_acks(struct.pack(">i", len(body)) + body) == acks
    assert _produce_acks(struct.pack(">i", 9) + body[:9]) is None   # cut short: unknown


def end_txn(corr, tid="tx", version=1, committed=True):
    body = headers.request_header(ApiKey.END_TXN, version, corr, "c")
    if version >= 3:   # flexible: compact string, tagged fields
        body += bytes([len(tid) + 1]) + tid.encode() + struct.pack(">qh?", 7, 0, committed) + b"\0"
    else:
        body += struct.pack(">h", len(tid)) + tid.encode() + struct.pack(">qh?", 7, 0, committed)
    return struct.pack(">i", len(body)) + body


def txn_produce(corr, tid="tx", version=3):
    body = (headers.request_header(ApiKey.PRODUCE, version, corr, "c")
            + produce.encode_request(version, -1, 1000, {"t": [(0, b"R")]}, transactional_id=tid))
    return struct.pack(">i", len(body)) + body


@pytest.mark.parametrize("frame, api_key, tid", [
    (end_txn(1, version=1), ApiKey.END_TXN, "tx"), (end_txn(1, "t-1", version=3), ApiKey.END_TXN, "t-1"),
    (txn_produce(1, version=3), ApiKey.PRODUCE, "tx"), (txn_produce(1, "t-9", version=9), ApiKey.PRODUCE, "t-9"),
    (txn_produce(1, None, version=9), ApiKey.PRODUCE, None), (end_txn(1)[:12], ApiKey.END_TXN, None)])
def test_reads_the_transactional_id_of_end_txn_and_produce(frame, api_key, tid):
    assert transactional_id(frame, api_key) == tid


async def test_late_endtxn_reaches_the_broker_after_the_next_transaction_wrote():
    """The EndTxn is held and its connection closed after hold_s; another producer's Produce
    does not release it; its own producer's next Produce is written, then the EndTxn reaches the
    broker (on a connection of its own), then the Produce's answer reaches the client."""
    server = EchoServer(tails={ApiKey.END_TXN: struct.pack(">ih", 0, 0)})   # EndTxn v1: throttle, NONE
    addr = await server.start()
    proxy = FaultProxy(addr, FaultConfig(late_endtxn_probability=1.0, late_endtxn_hold_s=0.2))
    await proxy.start()
    try:
        t0 = time.monotonic()
        assert await roundtrip(proxy.bootstrap, [end_txn(1)]) == ["closed"]
        assert time.monotonic() - t0 >= 0.2 and server.processed == []
        assert await roundtrip(proxy.bootstrap, [txn_produce(2, "another")]) == [2]
        assert await roundtrip(proxy.bootstrap, [txn_produce(3)]) == [3]
        assert server.processed == [(ApiKey.PRODUCE, 2), (ApiKey.PRODUCE, 3), (ApiKey.END_TXN, 1)]
        assert proxy.late is not None and proxy.late.stats == {
            "EndTxn(COMMIT) held": 1, "delivered after the next transaction's first Produce was written": 1,
            "late EndTxn(COMMIT) answered NONE": 1}
        assert await roundtrip(proxy.bootstrap, [end_txn(4, committed=False)]) == ["closed"]  # held again
        proxy.enabled = False
        assert await roundtrip(proxy.bootstrap, [end_txn(5, "t2")]) == [5]   # faults off: forwarded
    finally:
        await proxy.stop()
