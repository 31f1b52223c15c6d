"""The controller listener's limits on what a connection may send, Kafka's names and defaults (the
controller is a listener like any other): `sasl.server.max.receive.size` caps a frame before the
connection has authenticated (an anonymous peer cannot make the controller hold more than that
per connection), `connections.max.idle.ms` closes a connection that sent nothing for that long,
and `connection.failed.authentication.delay.ms` holds a failed login's close, which slows
password guessing without holding up other connections (each connection is its own coroutine).
"""
from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oncelog.core.security.sasl import SASL_SERVER_MAX_RECEIVE_SIZE

MAX_FRAME = 10 << 20                # what an authenticated peer may send in one request


@dataclass(frozen=True)
class ConnectionLimits:
    max_receive_size: int = SASL_SERVER_MAX_RECEIVE_SIZE
    idle_ms: int = 600000               # negative: never idle
    failed_authentication_delay_ms: int = 100

    @classmethod
    def from_settings(cls, get: Callable[[str], Any]) -> ConnectionLimits:
        """From the Kafka-named `SETTINGS` (`get(name)`, None where unset: Kafka's default): a
        broker's for the controller it runs in-process, `oncelog controller --override`'s for one
        on its own. Raises ValueError for a value Kafka would refuse."""
        limits = cls(**{field: int(get(name)) for name, field in SETTINGS.items() if get(name) is not None})
        if limits.max_receive_size < 1 or limits.failed_authentication_delay_ms < 0:
            raise ValueError("sasl.server.max.receive.size must be at least 1 and "
                             "connection.failed.authentication.delay.ms at least 0")
        if 0 <= limits.idle_ms <= limits.failed_authentication_delay_ms:
            raise ValueError(f"connection.failed.authentication.delay.ms={limits.failed_authentication_delay_ms} "
                             f"should always be less than connections.max.idle.ms={limits.idle_ms}")
        return limits


SETTINGS = {"sasl.server.max.receive.size": "max_receive_size", "connections.max.idle.ms": "idle_ms",
            "connection.failed.authentication.delay.ms": "failed_authentication_delay_ms"}


class Refused(Exception):
    """The peer broke a limit; the message is for the log line, and the connection closes."""


class Idle(Refused):
    """Nothing received for connections.max.idle.ms: closed, as Kafka's Selector closes it, with a
    debug line only (a broker's link that had nothing to ask is healthy, not a fault)."""


async def read_frame(reader: asyncio.StreamReader, limits: ConnectionLimits, authenticated: bool) -> memoryview:
    """The next size-prefixed frame. Raises Refused (too large, or idle), or IncompleteReadError
    when the peer closed."""
    size = struct.unpack(">i", await _read(reader, 4, limits.idle_ms))[0]
    max_size, name = (MAX_FRAME, "the controller's limit") if authenticated else (
        limits.max_receive_size, "sasl.server.max.receive.size")
    if not 0 <= size <= max_size:
        raise Refused(f"frame of {size} bytes {'' if authenticated else 'before authentication '}"
                      f"is over {name} ({max_size})")
    return memoryview(await _read(reader, size, limits.idle_ms))


async def _read(reader: asyncio.StreamReader, n: int, idle_ms: int) -> bytes:
    """`n` bytes; any bytes received restart the idle clock (Kafka counts socket activity)."""
    if idle_ms < 0:
        return await reader.readexactly(n)
    chunks: list[bytes] = []
    left = n
    while left:
        try:
            async with asyncio.timeout(idle_ms / 1000):
                chunk = await reader.read(min(left, 1 << 16))
        except TimeoutError:
            raise Idle(f"idle: nothing received for {idle_ms} ms (connections.max.idle.ms)") from None
        if not chunk:
            raise asyncio.IncompleteReadError(b"".join(chunks), n)
        chunks.append(chunk)
        left -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
