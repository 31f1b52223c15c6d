"""One client connection: frames in, requests applied one at a time and answered in order.

Kafka's guarantee, which idempotent producers rely on: the next request is read meanwhile, but
starts only when the one before it has applied everything (`Connection`). Bad input costs only
this connection: an oversized frame is refused from its size prefix, and a request the dispatch
cannot read (`BadRequest`) closes it with a log line. TLS starts per connection, so a failed
handshake is logged with its address; on a SASL listener the frames before authentication go to
`ConnectionAuth`.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
import types
from collections import deque
from collections.abc import Coroutine, Generator
from typing import TYPE_CHECKING, Any, Protocol

from oncelog.broker.net.dispatch import BadRequest, Response
from oncelog.broker.net.later import Later
from oncelog.broker.security.authentication import ConnectionAuth, ListenerSecurity
from oncelog.core.security.principal import ANONYMOUS, NoMatchingRule
from oncelog.protocol.api import ApiKey
from oncelog.protocol.framing import FrameError, FrameReader
from oncelog.storage.segment import FileRegion

if TYPE_CHECKING:
    from oncelog.broker.config import BrokerConfig
    from oncelog.broker.metrics import BrokerMetrics
    from oncelog.broker.net.connection_limits import ConnectionGate
    from oncelog.broker.net.dispatch import Dispatcher

log = logging.getLogger("oncelog.broker")

class ConnectionOwner(Protocol):
    """What a connection uses of the broker that accepted it (`net.server.Broker`)."""
    config: BrokerConfig
    connections: set[Connection]     # the open ones, each adds and discards itself
    metrics: BrokerMetrics
    connection_gate: ConnectionGate
    dispatcher: Dispatcher

    def now_ms(self) -> int: ...


_MAX_QUEUED_FRAMES = 64  # stop reading from a client that pipelines more than this
_TLS_HANDSHAKE_TIMEOUT_S = 10.0


def _is_produce(frame: memoryview) -> bool:
    # Only a Produce starts while answers before it wait for their fsync: any other request (a
    # Fetch reading what the Produce wrote) sees the connection's earlier requests answered.
    return len(frame) >= 2 and frame[0] == 0 and frame[1] == ApiKey.PRODUCE


class Connection(asyncio.BufferedProtocol):
    """Requests are applied one at a time, in order, and answered in order, as Kafka's socket
    server mutes a channel until its response is sent: a request that waits (a long-poll Fetch, a
    JoinGroup, a Produce's KIP-890 verification by another broker) holds up the requests behind
    it, which are read meanwhile. The one exception: a Produce that has appended everything and
    only waits for its fsync (its handler returns a `Later` answer) lets the Produce requests
    behind it start, so that their appends join the same group commit; its answer still goes out
    first. Any other request waits until every answer before it is out."""

    def __init__(self, broker: ConnectionOwner, security: ListenerSecurity) -> None:
        self.broker = broker
        self.security = security
        self.auth: ConnectionAuth = None  # type: ignore[assignment]  # set once the connection is established
        self.decoder = FrameReader(broker.config["socket.request.max.bytes"])
        # the reader's own method as the protocol's: asyncio calls it once per read, with no hop between
        self.get_buffer = self.decoder.get_buffer  # type: ignore[method-assign]
        self.queue: deque[memoryview] = deque()
        self.outbox: deque = deque()  # answers in request order: bytes, or Laters still waiting
        self.outbox_empty = asyncio.Event()
        self.outbox_empty.set()
        # None until connection_made, which asyncio calls before any other callback
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.peer = "?"
        self.peer_host = ""
        self.worker: asyncio.Task | None = None
        self.wakeup = asyncio.Event()
        self.reading_paused = False
        self.closing = False
        self.busy = False
        self.current: asyncio.Future | None = None  # the waiting request that holds up the ones behind it
        self.muted = False            # KIP-219: no reads while a quota throttle lasts
        self._muted_until = 0.0
        self.listener = security.name
        self.last_active = time.monotonic()   # connections.max.idle.ms counts from here
        self.sendfile_fd: int | None = None   # the plain socket's descriptor, which Fetch answers are sent to

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.peer_host = f"/{peer[0]}" if peer else ""
        self.broker.connections.add(self)
        tls = self.security.tls
        if tls is None:
            self._established(transport)
            return
        # start_tls must take the socket before connection_made returns: uvloop starts reading as
        # soon as it does, and a ClientHello read here would be taken for a request frame.
        # `_start` runs the coroutine up to its first wait, which is past start_tls's switch.
        _done, self.worker = _start(self._start_tls(transport, tls.context))

    async def _start_tls(self, raw, context) -> None:
        try:
            tls_transport = await asyncio.get_running_loop().start_tls(
                raw, self, context, server_side=True, ssl_handshake_timeout=_TLS_HANDSHAKE_TIMEOUT_S)
        except (OSError, TimeoutError, ConnectionError, ValueError) as e:
            log.warning("TLS handshake failed from %s on %s: %s", self.peer, self.security.name,
                        getattr(e, "reason", None) or e or type(e).__name__)
            self.broker.metrics.connections_closed.inc()
            raw.close()
            self._gone()
            return
        if self.closing or tls_transport is None:
            return
        self._established(tls_transport)
        await self._work()

    def _established(self, transport) -> None:
        self.transport = transport
        if self.security.tls is None:
            sock = transport.get_extra_info("socket")
            self.sendfile_fd = sock.fileno() if sock is not None else None
        self.auth = ConnectionAuth(self.security, self.peer)
        tls = self.security.tls
        if tls is not None and not self.security.protocol.uses_sasl:
            try:
                self.auth.principal = tls.principal(transport.get_extra_info("ssl_object"))
            except NoMatchingRule as e:
                log.warning("closing connection from %s on %s: no ssl.principal.mapping.rules rule maps the "
                            "certificate name: %s", self.peer, self.security.name, e)
                self.close()
                return
        self._apply_receive_limit()
        if self.worker is None:
            self.worker = asyncio.create_task(self._work())

    def _apply_receive_limit(self) -> None:
        """Frames before authentication are capped at sasl.server.max.receive.size."""
        limit = self.auth.receive_limit
        full = self.broker.config["socket.request.max.bytes"]
        self.decoder.max_size = full if limit is None else min(limit, full)
        self.decoder.limit_name = "socket.request.max.bytes" if limit is None else "sasl.server.max.receive.size"

    def buffer_updated(self, nbytes: int) -> None:
        if self.closing:
            return
        self.last_active = time.monotonic()
        try:
            frames = self.decoder.buffer_updated(nbytes)
        except FrameError as e:
            self._refuse(str(e))
            return
        now = self.broker.now_ms()
        for frame in frames:
            if self.busy or self.queue or not self._may_start(frame) or self.auth.intercepts(frame, now):
                self.queue.append(frame)
                continue
            try:
                answered, result = _start(self._handle(frame))
            except BadRequest as e:
                self._refuse(str(e))
                return
            except Exception:  # noqa: BLE001 - a handler bug: logged, the connection closed, the broker stays up
                self._internal_error()
                return
            if answered:
                self._send(result)
            else:
                self.busy = True
                self.current = result
                self.wakeup.set()
        if len(self.queue) >= _MAX_QUEUED_FRAMES and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        if self.queue:
            self.wakeup.set()

    def _may_start(self, frame: memoryview) -> bool:
        return not self.outbox or (_is_produce(frame) and len(self.outbox) < _MAX_QUEUED_FRAMES)

    def _send(self, response: Response | Later | None) -> None:
        if response is None or self.closing:
            return
        if isinstance(response, Later):
            self.outbox.append(response)
            self.outbox_empty.clear()
            response.on_done(self._flush_outbox)   # at once if it is done already
        elif self.outbox:
            self.outbox.append(response)
        else:
            self._write(response)

    def _write(self, response: Response) -> None:
        if isinstance(response, bytes):
            self.transport.write(response)
            return
        # A Fetch answer with regions of log files: on a plain socket whose transport has
        # nothing buffered, sent straight from the page cache (os.sendfile, as Kafka's
        # FileRecords.writeTo); what the socket does not take at once, and everything over TLS,
        # is read once and goes through the transport, in order.
        parts: list = response
        try:
            if self.sendfile_fd is not None and not self.transport.get_write_buffer_size():
                parts = send_direct(self.sendfile_fd, parts)
            parts = [p.read() if isinstance(p, FileRegion) else p for p in parts]
        except ConnectionError:
            self._abort()
            return
        except OSError as e:   # a region no longer readable whole: the answer cannot be completed
            log.warning("closing connection from %s: a Fetch answer could not be sent: %s", self.peer, e)
            self.broker.metrics.connections_closed.inc()
            self._abort()
            return
        if parts:
            self.transport.writelines(parts)

    def _flush_outbox(self, _later: Later | None = None) -> None:
        """Write the answers at the head of the outbox that are ready, in order."""
        while self.outbox:
            head = self.outbox[0]
            if isinstance(head, Later):
                if not head.done:
                    return
                self.outbox.popleft()
                try:
                    response = head.result()
                except Exception:  # noqa: BLE001 - a handler bug: logged, the connection closed, the broker stays up
                    self._internal_error()
                    return
            else:
                response = self.outbox.popleft()
            if response is not None and not self.closing:
                self._write(response)
        self.outbox_empty.set()
        if self.queue:
            self.wakeup.set()

    def mute(self, ms: int) -> None:
        """KIP-219: stop reading for `ms` (the throttled answer still goes out)."""
        if self.closing:
            return
        if not self.muted:
            self.muted = True
            self.transport.pause_reading()
        loop = asyncio.get_running_loop()
        until = loop.time() + ms / 1000
        if until > self._muted_until:
            self._muted_until = until
            loop.call_at(until, self._unmute, until)

    def _unmute(self, until: float) -> None:
        if self.closing or not self.muted or until != self._muted_until:
            return
        self.muted = False
        if not self.reading_paused:
            self.transport.resume_reading()


    def _handle(self, frame: memoryview) -> Coroutine[Any, Any, Response | Later | None]:
        return self.broker.dispatcher.handle(frame, self.peer_host, self.auth.principal, self.security.name,
                                             self.mute)

    async def _authenticate(self, frame: memoryview) -> bool:
        """A frame the authenticator takes; True when it is a request to handle after all."""
        outcome = await self.auth.take(frame, self.broker.now_ms(), self._handle)
        self._apply_receive_limit()
        if outcome.handle:
            return True
        if outcome.close_after_ms and not outcome.close:
            # KIP-306: the failure answer itself waits connection.failed.authentication.delay.ms
            # (a guesser learns nothing sooner; issue 36: only the close used to wait), then the
            # connection closes. Nothing more is read meanwhile; other connections are served.
            self.closing = True
            self.queue.clear()
            self.transport.pause_reading()
            self.broker.metrics.connections_closed.inc()
            asyncio.get_running_loop().call_later(outcome.close_after_ms / 1000, self._answer_and_close,
                                                  outcome.response)
            return False
        if outcome.response is not None and not self.closing:
            self.transport.write(outcome.response)
        if outcome.close:
            self.broker.metrics.connections_closed.inc()
            self.close()
        return False

    def _answer_and_close(self, response: bytes | None) -> None:
        if response is not None and self.transport is not None and not self.transport.is_closing():
            self.transport.write(response)
        self.close()

    def connection_lost(self, exc) -> None:
        self._gone()

    def _gone(self) -> None:
        self.broker.connection_gate.release(self)
        self.closing = True
        self.broker.connections.discard(self)
        self.wakeup.set()

    def _refuse(self, why: str) -> None:
        log.warning("closing connection from %s: %s", self.peer, why)
        self.broker.metrics.connections_closed.inc()
        self.close()

    def handling(self) -> bool:
        """A request of this connection is being handled or waits its turn (not idle)."""
        return self.busy or bool(self.queue) or bool(self.outbox)

    def close_idle(self, idle_ms: int) -> None:
        principal = self.auth.principal if self.auth is not None else ANONYMOUS
        log.info("closing idle connection of %s from %s on %s: nothing received for %d ms "
                 "(connections.max.idle.ms)", principal, self.peer, self.listener, idle_ms)
        self.close()

    def _abort(self) -> None:
        self.close()
        self.transport.abort()

    def close(self) -> None:
        self.closing = True
        self.queue.clear()
        if self.transport is not None:
            self.transport.close()
        self.wakeup.set()
        self.outbox_empty.set()

    def _internal_error(self) -> None:
        log.exception("internal error handling a request from %s; closing that connection", self.peer)
        self.broker.metrics.connections_closed.inc()
        self.close()

    async def _work(self) -> None:
        """Runs requests that wait, and whatever arrived behind them, in order."""
        while not self.closing:
            if self.current is None and not self.queue:
                self.busy = False
                self.wakeup.clear()
                await self.wakeup.wait()
                continue
            self.busy = True
            try:
                if self.current is not None:
                    pending, self.current = self.current, None
                    response = await pending
                else:
                    if not self._may_start(self.queue[0]):
                        await self.outbox_empty.wait()  # answers before it go out first
                        continue
                    frame = self.queue.popleft()
                    if self.reading_paused and len(self.queue) < _MAX_QUEUED_FRAMES // 2:
                        self.reading_paused = False
                        if not self.muted:
                            self.transport.resume_reading()
                    if self.auth.intercepts(frame, self.broker.now_ms()) and not await self._authenticate(frame):
                        continue
                    answered, response = _start(self._handle(frame))
                    if not answered:
                        response = await response
            except BadRequest as e:
                self._refuse(str(e))
                return
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a handler bug: logged, the connection closed, the broker stays up
                self._internal_error()
                return
            self._send(response)


def _start(request: Coroutine[Any, Any, Any]) -> tuple[bool, Any]:
    """Runs a request's coroutine until it first waits: (True, its response) if it never does,
    else (False, a task running the rest). Most requests never wait, and answering them here,
    without a task, saves most of a small request's latency (a task costs a trip through the
    event loop); a Produce appends here, in arrival order, even when its answer then waits for
    an fsync. Raises what the coroutine raises before it waits."""
    try:
        waiting_on = request.send(None)
    except StopIteration as done:
        return True, done.value
    return False, asyncio.ensure_future(_resume(request, waiting_on))


@types.coroutine
def _resume(request: Coroutine[Any, Any, Any], waiting_on: Any) -> Generator[Any, Any, Any]:
    """The rest of a coroutine `_start` ran by hand, for a task: the task first waits for what
    the coroutine yielded (a future, as `await` yields it), then drives it as it would have
    from the start. What the task throws in (a cancellation) goes to the coroutine."""
    while True:
        try:
            yield waiting_on
        except BaseException as exc:  # noqa: BLE001 - not caught: thrown into the coroutine, which re-raises what it does not handle
            try:
                waiting_on = request.throw(exc)
            except StopIteration as done:
                return done.value
            continue
        return (yield from request)


def send_direct(fd: int, parts: list) -> list:
    """Write `parts` (bytes, and `FileRegion`s sent with os.sendfile) to the non-blocking socket
    `fd` until it would block; returns what is left, in order (a region partly sent is left as
    the bytes it still owes). Only while the transport has nothing buffered: these bytes must
    not overtake its own. Raises ConnectionError for a broken connection, OSError for a region
    whose file is shorter than it (neither answer can be completed)."""
    for i, part in enumerate(parts):
        if isinstance(part, FileRegion):
            sent = 0
            try:
                while sent < part.size:
                    n = os.sendfile(fd, part.fd, part.position + sent, part.size - sent)
                    if n == 0:
                        raise OSError(errno.EIO, f"segment file ended {part.size - sent} bytes short of a "
                                                 "region sent from it")
                    sent += n
            except BlockingIOError:
                return [part.read(sent), *parts[i + 1:]]
            part.close()
        else:
            try:
                n = os.write(fd, part)
            except BlockingIOError:
                n = 0
            if n < len(part):
                return [memoryview(part)[n:], *parts[i + 1:]]
    return []
