"""What stands between a listening socket and a served connection: Kafka's acceptor with its
connection quotas (`core.security.connection_quotas`: `max.connections`, per listener too,
`max.connection.creation.rate`, `max.connections.per.ip`, the `ip` entities'
`connection_creation_rate`), and the closing of idle connections (`connections.max.idle.ms`).

Each listener's sockets are accepted by a task of this module rather than by an asyncio server,
so that the broker can stop accepting, as Kafka's acceptor thread does: while a listener is at its
`max.connections` (or the broker at its own), or a creation rate makes it wait, the task accepts
nothing and new connections queue in the kernel's backlog, holding none of the broker's
descriptors. An address over its `connection_creation_rate` quota is accepted, never served, and
closed after its throttle time (KIP-612: a client that reconnects at once cannot hammer the
broker); one over `max.connections.per.ip` is closed at once. Refusals are logged at most once a
second, so a client hammering a full broker cannot flood the log.

A connection idle for `connections.max.idle.ms` (nothing read from it, no request of it being
handled) is closed with a log line naming principal and address. Kafka counts only socket
activity, so it also closes a connection whose request waited longer than that; oncelog does not.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, cast

from oncelog.core.security.connection_quotas import ConnectionQuotas
from oncelog.core.security.listeners import Endpoint
from oncelog.core.security.metadata import SecurityMetadata
from oncelog.core.security.quotas import CONNECTION_CREATION_RATE, DEFAULT, parse_per_ip_overrides

log = logging.getLogger("oncelog.broker")

_BACKLOG = 100          # asyncio's default, which the broker used before it accepted by itself


class Served(Protocol):
    """What this module needs of a broker connection (the protocol `ProtocolFactory` makes)."""
    listener: str
    last_active: float          # time.monotonic() of the last bytes read
    closing: bool

    def handling(self) -> bool: ...   # a request of it is being handled or waits to be
    def close_idle(self, idle_ms: int) -> None: ...
    def close(self) -> None: ...


ProtocolFactory = Callable[[], asyncio.BaseProtocol]     # makes a `Served`


class ConnectionGate:
    def __init__(self, config: Any, now_ms: Callable[[], int]) -> None:
        self._now_ms = now_ms
        self.idle_ms: int = config["connections.max.idle.ms"]
        self.quotas = ConnectionQuotas(samples=config["quota.window.num"],
                                       window_ms=config["quota.window.size.seconds"] * 1000,
                                       protected_listener=str(config["inter.broker.listener.name"]).upper())
        self._sockets: dict[str, list[socket.socket]] = {}
        self._admitted: dict[Served, tuple[str, str]] = {}     # counted connection -> (listener, address)
        self._tasks: list[asyncio.Task] = []
        self._throttled: dict[socket.socket, asyncio.TimerHandle] = {}
        self._slot_freed = asyncio.Event()
        self._config = config

    # ------------------------------------------------------------------ settings
    def configure(self, value: Callable[[str], Any]) -> None:
        """(Re)read the limits through `value(name)` (the broker's effective configs: static ones at
        start, dynamic ones after); connections waiting for a slot look again."""
        q = self.quotas
        q.max_connections = int(value("max.connections"))
        q.max_per_ip = int(value("max.connections.per.ip"))
        q.max_creation_rate = int(value("max.connection.creation.rate"))
        try:
            q.set_per_ip_overrides(_resolved(parse_per_ip_overrides(value("max.connections.per.ip.overrides"))))
        except (ValueError, OSError) as e:
            log.warning("max.connections.per.ip.overrides does not apply (%s); kept the previous ones", e)
        for name in self._sockets:
            q.set_listener(name, _listener_int(value, name, "max.connections"),
                           _listener_int(value, name, "max.connection.creation.rate"))
        self._slot_freed.set()

    def follow(self, state: SecurityMetadata) -> None:
        """The `ip` entities' `connection_creation_rate` quotas, as the broker follows them."""
        self.quotas.set_ip_rates({(None if e.ip is DEFAULT else e.ip): rate
                                  for e, rate in state.quotas.overrides(CONNECTION_CREATION_RATE).items()
                                  if e.ip is not None})

    # ------------------------------------------------------------------ listening
    def bind(self, endpoint: Endpoint) -> tuple[str, int]:
        """Listening sockets for `endpoint` (every address family its host resolves to, one port),
        not accepting yet; (host, port) of the first."""
        host = endpoint.host or None
        infos = dict.fromkeys((af, type_, proto, addr) for af, type_, proto, _, addr in socket.getaddrinfo(
            host, endpoint.port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE))
        sockets: list[socket.socket] = []
        port = endpoint.port
        try:
            for af, type_, proto, addr in infos:
                sock = socket.socket(af, type_, proto)
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    if af == socket.AF_INET6:
                        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                    sock.bind((addr[0], port, *addr[2:]))
                except OSError as e:
                    sock.close()
                    if not sockets:
                        raise OSError(e.errno, f"cannot listen on {endpoint}: {e.strerror}") from None
                    log.warning("listener %s: not listening on %s too: %s", endpoint.name, addr[0], e)
                    continue
                sock.listen(_BACKLOG)
                sock.setblocking(False)
                sockets.append(sock)
                port = sock.getsockname()[1]    # port 0: the other families take the same port
        except BaseException:
            for s in sockets:
                s.close()
            raise
        self._sockets[endpoint.name] = sockets
        self.quotas.set_listener(endpoint.name)
        self.configure(self._config.get)
        host_bound, port_bound = sockets[0].getsockname()[:2]
        return host_bound, port_bound

    def start(self, protocol_factories: dict[str, ProtocolFactory]) -> None:
        """Accept on every bound listener, each with its own kind of connection."""
        for listener, factory in protocol_factories.items():
            for sock in self._sockets[listener]:
                self._tasks.append(asyncio.create_task(self._accept_loop(listener, sock, factory)))
        self._tasks.append(asyncio.create_task(self._maintain()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for sockets in self._sockets.values():
            for sock in sockets:
                sock.close()
        for sock, handle in self._throttled.items():
            handle.cancel()
            sock.close()
        self._throttled.clear()

    def release(self, conn: Served) -> None:
        """`conn` is gone (called again, nothing happens); a waiting acceptor may go on."""
        counted = self._admitted.pop(conn, None)
        if counted is not None:
            self.quotas.release(*counted)
            self._slot_freed.set()

    # ------------------------------------------------------------------ accepting
    async def _accept_loop(self, listener: str, sock: socket.socket, protocol_factory: ProtocolFactory) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(sock)
            except OSError as e:    # out of descriptors, or the client gave up first: go on
                _log_refused(f"accepting on {listener} failed: {e}")
                await asyncio.sleep(0.1)
                continue
            try:
                await self._admit(listener, conn, address[0], protocol_factory)
            except asyncio.CancelledError:
                conn.close()
                raise
            except Exception:  # noqa: BLE001 - a bug here must not stop the listener
                log.exception("accepting a connection from %s on %s failed; closed it", address[0], listener)
                conn.close()

    async def _admit(self, listener: str, conn: socket.socket, ip: str, protocol_factory: ProtocolFactory) -> None:
        """Kafka's ConnectionQuotas.inc, then the connection is served."""
        wait_ms = self.quotas.record_connection(listener, self._now_ms())
        await self._wait_for_slot(listener, wait_ms)
        refusal = self.quotas.admit(listener, ip, self._now_ms())
        if refusal is not None:
            _log_refused(f"{refusal.reason} on {listener}")
            if refusal.delay_ms > 0:
                self._close_later(conn, refusal.delay_ms)
            else:
                conn.close()
            return
        made: list[Served] = []

        def counted() -> asyncio.BaseProtocol:
            protocol = protocol_factory()
            self._admitted[cast(Served, protocol)] = (listener, ip)
            made.append(cast(Served, protocol))
            return protocol
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await asyncio.get_running_loop().connect_accepted_socket(counted, conn)
        except BaseException as e:
            conn.close()
            if made:
                self.release(made[0])
            else:
                self.quotas.release(listener, ip)
                self._slot_freed.set()
            if not isinstance(e, OSError):
                raise
            log.info("connection from %s on %s closed as it was accepted: %s", ip, listener, e)   # reset first
            return
        self._make_room()

    async def _wait_for_slot(self, listener: str, wait_ms: int) -> None:
        """Kafka's waitForConnectionSlot: the creation rates' wait, then until a slot is free."""
        loop = asyncio.get_running_loop()
        until = loop.time() + wait_ms / 1000
        while True:
            remaining = until - loop.time()
            if remaining <= 0 and self.quotas.slot_available(listener):
                return
            self._slot_freed.clear()
            try:
                await asyncio.wait_for(self._slot_freed.wait(), remaining if remaining > 0 else None)
            except TimeoutError:
                pass

    def _close_later(self, conn: socket.socket, delay_ms: int) -> None:
        def close() -> None:
            self._throttled.pop(conn, None)
            conn.close()
        self._throttled[conn] = asyncio.get_running_loop().call_later(delay_ms / 1000, close)

    def _make_room(self) -> None:
        """Over `max.connections` (only the protected listener gets there): the least recently
        active connections of the other listeners are closed (Kafka's closeExcessConnections)."""
        if not self.quotas.excess():
            return
        open_ = [c for c in self._admitted if not c.closing]
        others = sorted((c for c in open_ if not self.quotas.is_protected(c.listener)), key=lambda c: c.last_active)
        for victim in others[:len(open_) - self.quotas.max_connections]:
            log.info("closing the least recently active connection on %s: max.connections = %d reached with %s",
                     victim.listener, self.quotas.max_connections, self.quotas.protected_listener)
            victim.close()

    # ------------------------------------------------------------------ idle connections
    async def _maintain(self) -> None:
        """Idle connections closed, addresses that stopped connecting forgotten."""
        interval = min(max(self.idle_ms / 4, 10), 1000) / 1000 if self.idle_ms >= 0 else 1.0
        while True:
            await asyncio.sleep(interval)
            if self.idle_ms >= 0:
                self.close_idle(time.monotonic())
            self.quotas.expire(self._now_ms())

    def close_idle(self, now: float) -> None:
        for conn in list(self._admitted):
            if conn.closing:
                continue
            if conn.handling():
                conn.last_active = now      # idle time counts from the end of its last request
            elif (now - conn.last_active) * 1000 >= self.idle_ms:
                conn.close_idle(self.idle_ms)


def _listener_int(value: Callable[[str], Any], listener: str, name: str) -> int:
    """`listener.name.<l>.<name>` if set, else `<name>` (Kafka's valuesWithPrefixOverride)."""
    own = value(f"listener.name.{listener.lower()}.{name}")
    return int(own if own not in (None, "") else value(name))


def _resolved(overrides: dict[str, int]) -> dict[str, int]:
    """Host names in `max.connections.per.ip.overrides` become their addresses, as Kafka's
    InetAddress.getByName does (every address a name has gets its count)."""
    out: dict[str, int] = {}
    for host, count in overrides.items():
        for address in _addresses(host):
            out[address] = count
    return out


def _addresses(host: str) -> Iterable[str]:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        return (host,)
    except OSError:
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}


_last_refusal_log = [0.0]


def _log_refused(why: str) -> None:
    """At most one line a second: a client hammering a full broker must not flood the log."""
    now = time.monotonic()
    if now - _last_refusal_log[0] >= 1.0:
        _last_refusal_log[0] = now
        log.info("refusing a connection: %s", why)
