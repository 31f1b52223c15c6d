"""Kafka-aware TCP fault proxy.

Sits between clients and one broker. Because it reads Kafka framing (int32 size prefix, request
header: api key int16, api version int16, correlation id int32) it can fault at request
granularity: delay each direction, reset a connection at random, or drop a response after the
broker processed the request (the "written but not acknowledged" case: the client sees the
connection close and must retry; an idempotent producer must not create a duplicate).

Start the broker with `advertised.listeners` pointing at the proxy's port so Metadata answers keep
clients on the proxy; no response rewriting is done here.

Faults are drawn from a seeded random.Random, so one seed gives one fault schedule for one
sequence of requests.
"""
from __future__ import annotations

import asyncio
import random
import struct
import threading
from collections import Counter
from dataclasses import dataclass, field

PRODUCE = 0


@dataclass
class FaultConfig:
    latency_ms_up: float = 0.0        # client -> broker
    latency_ms_down: float = 0.0      # broker -> client
    reset_probability: float = 0.0    # per request: close both sides before forwarding it
    drop_response_probability: float = 0.0  # per response: broker did the work, client never hears
    drop_api_keys: frozenset[int] = frozenset({PRODUCE})  # which requests' responses may be dropped
    seed: int = 0


@dataclass
class ProxyStats:
    connections: int = 0
    requests: Counter = field(default_factory=Counter)
    resets: int = 0
    dropped_responses: int = 0


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readexactly(4)
    (size,) = struct.unpack(">i", head)
    return head + await reader.readexactly(size)


class FaultProxy:
    def __init__(self, upstream: str, config: FaultConfig | None = None,
                 host: str = "127.0.0.1", port: int = 0):
        uh, up = upstream.rsplit(":", 1)
        self.upstream = (uh, int(up))
        self.config = config or FaultConfig()
        self.rng = random.Random(self.config.seed)
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
        self._held: dict[asyncio.StreamWriter, list[bytes]] = {}

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
        for w, frames in self._held.items():
            n = len(frames) if count is None else min(count, len(frames))
            for frame in frames[:n]:
                w.write(frame)
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
        # tells which request each response answers.
        pending: asyncio.Queue[int] = asyncio.Queue()
        held = self._held[cwriter] = []

        def abort() -> None:
            cwriter.transport.abort()
            bwriter.transport.abort()

        async def up() -> None:
            while True:
                frame = await _read_frame(creader)
                api_key = struct.unpack_from(">h", frame, 4)[0] if len(frame) >= 6 else -1
                self.stats.requests[api_key] += 1
                if self.enabled and self.rng.random() < self.config.reset_probability:
                    self.stats.resets += 1
                    abort()
                    return
                if self.config.latency_ms_up:
                    await asyncio.sleep(self.config.latency_ms_up / 1000)
                acks_zero = api_key == PRODUCE and _produce_acks(frame) == 0
                if not acks_zero:
                    pending.put_nowait(api_key)
                bwriter.write(frame)
                await bwriter.drain()

        async def down() -> None:
            while True:
                frame = await _read_frame(breader)
                api_key = pending.get_nowait() if not pending.empty() else -1
                if held or (self.holding and api_key in self.config.drop_api_keys):
                    held.append(frame)
                    continue
                if (self.enabled and api_key in self.config.drop_api_keys
                        and self.rng.random() < self.config.drop_response_probability):
                    self.stats.dropped_responses += 1
                    abort()
                    return
                if self.config.latency_ms_down:
                    await asyncio.sleep(self.config.latency_ms_down / 1000)
                cwriter.write(frame)
                await cwriter.drain()

        tasks = [asyncio.create_task(up()), asyncio.create_task(down())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            abort()
            self._conns.discard(cwriter)
            self._conns.discard(bwriter)
            self._held.pop(cwriter, None)


def _produce_acks(frame: bytes) -> int | None:
    """acks of a Produce request (acks=0 gets no response). Header: size, key, version, corr,
    client id (nullable string); v9+ adds tagged fields and a compact transactional id."""
    try:
        version = struct.unpack_from(">h", frame, 6)[0]
        pos = 12
        (n,) = struct.unpack_from(">h", frame, pos)
        pos += 2 + max(n, 0)
        if version >= 9:
            pos = _skip_tagged(frame, pos)      # request header tagged fields
            ln, pos = _uvarint(frame, pos)      # compact nullable transactional id
            pos += max(ln - 1, 0)
        elif version >= 3:
            (n,) = struct.unpack_from(">h", frame, pos)
            pos += 2 + max(n, 0)
        return struct.unpack_from(">h", frame, pos)[0]
    except struct.error:
        return None


def _skip_tagged(buf: bytes, pos: int) -> int:
    count, pos = _uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        pos += size
    return pos


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


async def _call(fn, *args):
    return fn(*args)


class ThreadedFaultProxy:
    """The proxy on its own event loop thread, for synchronous tests, the CLI and bench/."""

    def __init__(self, upstream: str, config: FaultConfig | None = None, port: int = 0):
        self.proxy = FaultProxy(upstream, config, port=port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="fault-proxy")

    def start(self) -> "ThreadedFaultProxy":
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
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> "ThreadedFaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
