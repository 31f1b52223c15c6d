"""Kafka-aware TCP fault proxy: the one proxy of tests, `oncelog verify`, `oncelog perf` and bench/.

Sits between clients and one broker. Because it reads Kafka framing (int32 size prefix, request
header: api key int16, api version int16, correlation id int32) it can fault at request
granularity: delay each direction, reset a connection at random, cut a connection in the middle of
a request after a number of client bytes, or drop a response after the broker processed the
request (the "written but not acknowledged" case: the client sees the connection close and must
retry; an idempotent producer must not create a duplicate), or hold responses until released;
and hold an EndTxn back until its producer has begun its next transaction (`late_endtxn`).

Start the broker with `advertised.listeners` pointing at the proxy's port (or give clients
`oncelog.address.map`) so Metadata answers keep clients on the proxy; no response rewriting is
done here.

TLS passes through: a connection whose first byte is a TLS handshake record (0x16, which as the
top byte of a Kafka size would mean a frame of 369 MB, so never a Kafka client) is relayed as TLS
records, and the same faults apply per record instead of per request: a reset before a client
record, a cut after a number of client bytes, a dropped response = the connection closed instead
of forwarding an application-data record from the broker after the client sent one (the request
was processed, its answer lost). The api key of an encrypted request is unknown, so
`drop_api_keys` does not narrow the drops there; requests are counted under `TLS_RECORD`.

Faults are drawn from a seeded random.Random, so one seed gives one fault schedule for one
sequence of requests.

One implementation, three ways to run it: `FaultProxy` on the caller's event loop,
`ThreadedFaultProxy` on an event loop thread of its own (synchronous tests, `LocalCluster`), and
`FaultProxyProcess` in a child process (`python -m oncelog.testing.fault_proxy`), so that the
proxy does not compete with the client it delays for the interpreter (`oncelog perf`, bench/).
"""
from __future__ import annotations

import argparse
import asyncio
import random
import re
import struct
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field

from oncelog.protocol import produce
from oncelog.protocol.api import ApiKey
from oncelog.protocol.headers import read_request_header
from oncelog.testing.embedded import ServerProcess
from oncelog.testing.late_endtxn import Held, LateEndTxn


@dataclass
class FaultConfig:
    latency_ms_up: float = 0.0        # client -> broker
    latency_ms_down: float = 0.0      # broker -> client
    reset_probability: float = 0.0    # per request: close both sides before forwarding it
    drop_response_probability: float = 0.0  # per response: broker did the work, client never hears
    drop_api_keys: frozenset[int] = frozenset({ApiKey.PRODUCE})  # which requests' responses may be dropped
    # per connection: after a number of client bytes drawn from this range, forward half of the
    # request that crosses it and close both sides (requests before it written, answers lost)
    cut_after_bytes: tuple[int, int] | None = None
    seed: int = 0
    # per EndTxn: hold it past the client's request timeout (late_endtxn_hold_s) and deliver it
    # once its producer's next transaction has written (testing.late_endtxn)
    late_endtxn_probability: float = 0.0
    late_endtxn_hold_s: float = 6.0


@dataclass
class ProxyStats:
    connections: int = 0
    requests: Counter = field(default_factory=Counter)
    resets: int = 0
    cuts: int = 0
    dropped_responses: int = 0


TLS_RECORD = -2             # stats key of a TLS record (its request is encrypted)
_TLS_HANDSHAKE, _TLS_APPLICATION_DATA = 0x16, 0x17


async def _read_frame(reader: asyncio.StreamReader, tls: bool = False, first: bytes = b"") -> bytes:
    """One Kafka frame (size included), or with `tls` one TLS record (header included);
    `first`: bytes of it already read."""
    head_size = 5 if tls else 4
    head = first + await reader.readexactly(head_size - len(first))
    size = struct.unpack_from(">H", head, 3)[0] if tls else struct.unpack(">i", head)[0]
    return head + await reader.readexactly(size)


class _Direction:
    """One direction of one connection. With a latency, frames are written in order, each that
    long after it arrived, by a writer task of its own: frames in flight overlap as on a long
    link (a sleep before forwarding each frame would add the latency once per pipelined request)."""

    def __init__(self, writer: asyncio.StreamWriter, latency_ms: float, close) -> None:
        self.writer, self.latency, self.close = writer, latency_ms / 1000, close
        self.queue: asyncio.Queue[tuple[float, bytes | None]] | None = None  # None: close
        self.task: asyncio.Task | None = None
        if self.latency:
            self.queue = asyncio.Queue()
            self.task = asyncio.create_task(self._forward())

    def send(self, frame: bytes) -> None:
        if self.queue is not None:
            self.queue.put_nowait((asyncio.get_running_loop().time() + self.latency, frame))
        else:
            self.writer.write(frame)

    def close_after_sent(self) -> None:
        """Close the connection once what was sent before is written."""
        if self.queue is not None:
            self.queue.put_nowait((asyncio.get_running_loop().time() + self.latency, None))
        else:
            self.close()

    async def drain(self) -> None:
        if self.queue is None:
            await self.writer.drain()

    async def _forward(self) -> None:
        loop = asyncio.get_running_loop()
        queue = self.queue
        assert queue is not None  # forwarding runs only with a delay queue
        try:
            while True:
                due, frame = await queue.get()
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                if frame is None or self.writer.transport.is_closing():
                    break
                self.writer.write(frame)
                await self.writer.drain()
        except (ConnectionError, OSError):
            pass
        self.close()


class FaultProxy:
    def __init__(self, upstream: str, config: FaultConfig | None = None,
                 host: str = "127.0.0.1", port: int = 0, late: LateEndTxn | None = None):
        uh, up = upstream.rsplit(":", 1)
        self.upstream = (uh, int(up))
        self.config = config or FaultConfig()
        self.rng = random.Random(self.config.seed)
        c = self.config
        # the proxies of a cluster share one (its EndTxn and the Produce after it meet different brokers)
        self.late = late or (LateEndTxn(c.late_endtxn_probability, c.late_endtxn_hold_s, c.seed)
                             if c.late_endtxn_probability else None)
        self.stats = ProxyStats()
        self.enabled = True  # faults on/off; latency applies always
        self._host, self._port = host, port
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task] = set()
        # "the broker did the work, the answer never comes, the connection stays open": while
        # holding, responses to drop_api_keys are kept; later answers on that connection queue
        # behind them (Kafka answers in order) until `release`
        self.holding = False
        self._held: dict[_Direction, list[bytes]] = {}

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[:2]

    @property
    def bootstrap(self) -> str:
        h, p = self.address
        return f"{h}:{p}"

    async def start(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._handle, self._host, self._port)
        return self.address

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._conns):
                w.transport.abort()
            for t in list(self._handlers):
                t.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    def hold(self, on: bool = True) -> None:
        """Start (or stop) keeping responses to drop_api_keys from the client."""
        self.holding = on

    def release(self, count: int | None = None) -> None:
        """Forward the first `count` held responses of each connection (all if None)."""
        for down, frames in self._held.items():
            n = len(frames) if count is None else min(count, len(frames))
            for frame in frames[:n]:
                down.send(frame)
            del frames[:n]

    @property
    def held(self) -> int:
        """Responses kept from clients right now."""
        return sum(map(len, self._held.values()))

    def reset_all(self) -> None:
        """Abort every open connection now (a network blip)."""
        for w in list(self._conns):
            w.transport.abort()
        self.stats.resets += 1

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        me = asyncio.current_task()
        if me is not None:
            self._handlers.add(me)
            me.add_done_callback(self._handlers.discard)
        try:
            breader, bwriter = await asyncio.open_connection(*self.upstream)
        except OSError:
            cwriter.transport.abort()
            return
        self._conns.update((cwriter, bwriter))
        # Responses come back in request order on a Kafka connection, so a FIFO of api keys
        # tells which request each response answers (with a late EndTxn to deliver once it is
        # answered, if the request is the Produce its producer was waiting for)
        pending: asyncio.Queue[tuple[int, Held | None]] = asyncio.Queue()
        cfg = self.config
        budget = self.rng.randint(*cfg.cut_after_bytes) if cfg.cut_after_bytes else None

        def abort() -> None:
            cwriter.transport.abort()
            bwriter.transport.abort()

        to_broker = _Direction(bwriter, cfg.latency_ms_up, abort)
        to_client = _Direction(cwriter, cfg.latency_ms_down, abort)
        held = self._held[to_client] = []
        try:
            first = await creader.readexactly(1)
        except (asyncio.IncompleteReadError, ConnectionError):
            abort()
            return
        tls = first[0] == _TLS_HANDSHAKE
        late = None if tls else self.late

        async def up() -> None:
            nonlocal budget, first
            while True:
                frame = await _read_frame(creader, tls, first)
                first = b""
                if tls:
                    api_key = TLS_RECORD if frame[0] == _TLS_APPLICATION_DATA else -1
                else:
                    api_key = struct.unpack_from(">h", frame, 4)[0] if len(frame) >= 6 else -1
                self.stats.requests[api_key] += 1
                if self.enabled and self.rng.random() < cfg.reset_probability:
                    self.stats.resets += 1
                    abort()
                    return
                if budget is not None and self.enabled:
                    budget -= len(frame)
                    if budget <= 0:
                        self.stats.cuts += 1
                        to_broker.send(frame[:len(frame) // 2])
                        to_broker.close_after_sent()
                        if to_broker.task is not None:
                            await to_broker.task  # what is on the wire arrives, then the close
                        return
                if late is not None and self.enabled and api_key == ApiKey.END_TXN and \
                        late.hold(frame, self.upstream) is not None:
                    # the connection hangs past the client's request timeout, then closes; the
                    # EndTxn reaches the broker later, on a connection of its own
                    await asyncio.sleep(late.hold_s)
                    return
                due = late.due(frame) if late is not None and api_key == ApiKey.PRODUCE else None
                acks_zero = not tls and api_key == ApiKey.PRODUCE and _produce_acks(frame) == 0
                if not acks_zero and (not tls or api_key == TLS_RECORD):
                    pending.put_nowait((api_key, due))
                to_broker.send(frame)
                await to_broker.drain()
                if due is not None and late is not None and acks_zero:   # no answer to wait for
                    await late.deliver(due, "after the next transaction's first Produce was sent")

        droppable = {TLS_RECORD} if tls else cfg.drop_api_keys

        async def down() -> None:
            while True:
                frame = await _read_frame(breader, tls)
                due = None
                if tls:   # a response to some request, if the client sent one since the last
                    api_key = -1
                    if frame[0] == _TLS_APPLICATION_DATA and not pending.empty():
                        while not pending.empty():
                            api_key = pending.get_nowait()[0]
                else:
                    api_key, due = pending.get_nowait() if not pending.empty() else (-1, None)
                if due is not None and late is not None:
                    # the next transaction has written: the late EndTxn lands on it before its
                    # producer hears of the write
                    await late.deliver(due, "after the next transaction's first Produce was written")
                if held or (self.holding and api_key in droppable):
                    held.append(frame)
                    continue
                if (self.enabled and api_key in droppable
                        and self.rng.random() < cfg.drop_response_probability):
                    self.stats.dropped_responses += 1
                    abort()
                    return
                to_client.send(frame)
                await to_client.drain()

        tasks = [asyncio.create_task(up()), asyncio.create_task(down())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            tasks += [d.task for d in (to_broker, to_client) if d.task is not None]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            abort()
            self._conns.discard(cwriter)
            self._conns.discard(bwriter)
            self._held.pop(to_client, None)
            while late is not None and not pending.empty():
                due = pending.get_nowait()[1]
                if due is not None:   # its Produce was never answered here: the next one delivers it
                    late.put_back(due)


def _produce_acks(frame: bytes) -> int | None:
    """acks of a Produce request (acks=0 gets no response); `frame` starts with its size."""
    try:
        header = read_request_header(memoryview(frame)[4:])
        return produce.request_acks(header.api_version, memoryview(frame)[4 + header.body_offset:])
    except (struct.error, ValueError, IndexError):
        return None


async def _call(fn, *args):
    return fn(*args)


class ThreadedFaultProxy:
    """The proxy on its own event loop thread, for synchronous tests, the CLI and bench/."""

    def __init__(self, upstream: str, config: FaultConfig | None = None, port: int = 0,
                 late: LateEndTxn | None = None):
        self.proxy = FaultProxy(upstream, config, port=port, late=late)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="fault-proxy")

    def start(self) -> ThreadedFaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self._loop).result(10)
        return self

    @property
    def bootstrap(self) -> str:
        return self.proxy.bootstrap

    @property
    def stats(self) -> ProxyStats:
        return self.proxy.stats

    def reset_all(self) -> None:
        self._loop.call_soon_threadsafe(self.proxy.reset_all)

    def hold(self, on: bool = True) -> None:
        asyncio.run_coroutine_threadsafe(_call(self.proxy.hold, on), self._loop).result(10)

    def release(self, count: int | None = None) -> None:
        asyncio.run_coroutine_threadsafe(_call(self.proxy.release, count), self._loop).result(10)

    @property
    def held(self) -> int:
        return asyncio.run_coroutine_threadsafe(
            _call(lambda: self.proxy.held), self._loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.stop(), self._loop).result(10)
        asyncio.run_coroutine_threadsafe(_cancel_the_rest(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> ThreadedFaultProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class FaultProxyProcess(ServerProcess):
    """The proxy in a child process: it does not share the interpreter of the client it delays,
    so it adds its latency and nothing of its own to what a benchmark measures. Its stats stay in
    the child."""

    listening = re.compile(r"proxy listening on ([\d.]+):(\d+)")
    name = "fault proxy"

    def __init__(self, upstream: str, config: FaultConfig | None = None, port: int = 0) -> None:
        super().__init__(port=port)
        self.upstream, self.config = upstream, config or FaultConfig()

    def command(self) -> list[str]:
        c = self.config
        cmd = [sys.executable, "-m", "oncelog.testing.fault_proxy", self.upstream, "--port", str(self.port),
               "--latency-ms-up", str(c.latency_ms_up), "--latency-ms-down", str(c.latency_ms_down),
               "--reset-probability", str(c.reset_probability),
               "--drop-response-probability", str(c.drop_response_probability),
               "--drop-api-keys", ",".join(map(str, sorted(c.drop_api_keys))), "--seed", str(c.seed)]
        if c.cut_after_bytes:
            cmd += ["--cut-after-bytes", "{},{}".format(*c.cut_after_bytes)]
        return cmd

    def stop(self, timeout_s: float = 5) -> int | None:
        self.kill()  # nothing to shut down cleanly
        return self.proc.returncode if self.proc else None


def _low_high(text: str) -> tuple[int, int]:
    low, high = map(int, text.split(","))
    return low, high


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="A Kafka-aware fault proxy in front of one broker.")
    ap.add_argument("upstream", help="the broker, host:port")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency-ms-up", type=float, default=0.0)
    ap.add_argument("--latency-ms-down", type=float, default=0.0)
    ap.add_argument("--reset-probability", type=float, default=0.0)
    ap.add_argument("--drop-response-probability", type=float, default=0.0)
    ap.add_argument("--drop-api-keys", default=str(int(ApiKey.PRODUCE)))
    ap.add_argument("--cut-after-bytes", default=None, help="LOW,HIGH")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    config = FaultConfig(a.latency_ms_up, a.latency_ms_down, a.reset_probability, a.drop_response_probability,
                         frozenset(int(k) for k in a.drop_api_keys.split(",") if k),
                         _low_high(a.cut_after_bytes) if a.cut_after_bytes else None, a.seed)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass

    async def serve() -> None:
        proxy = FaultProxy(a.upstream, config, port=a.port)
        await proxy.start()
        print(f"proxy listening on {proxy.bootstrap}", flush=True)
        await asyncio.Event().wait()
    asyncio.run(serve())


async def _cancel_the_rest() -> None:
    """A connection's forwarding tasks outlive its handler; a loop closed under them prints
    "Task was destroyed but it is pending" and "Event loop is closed" at exit."""
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in rest:
        t.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


if __name__ == "__main__":
    main(sys.argv[1:])

