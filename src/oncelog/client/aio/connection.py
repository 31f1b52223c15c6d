"""One TCP connection to a broker: size-prefixed frames, correlation ids, pipelined requests,
ApiVersions negotiation. Requests are written in order and answered in order (Kafka's guarantee
per connection); a lost connection fails every outstanding request with ConnectionError."""
from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from collections import deque

from oncelog.client.aio import wire
from oncelog.client.errors import KafkaClientError
from oncelog.client.security import ClientSecurity, SaslExchange
from oncelog.protocol import api_versions, entities, headers
from oncelog.protocol.api import ApiKey
from oncelog.protocol.framing import FrameError, FrameReader

log = logging.getLogger("oncelog.client.connection")

_SIZE = struct.Struct(">i")
_CORR = struct.Struct(">i")
MAX_FRAME = 512 * 1024 * 1024


class BrokerConnectionError(KafkaClientError, ConnectionError):
    """The connection to a broker failed or closed; outstanding requests have unknown outcomes."""


class AuthenticationError(BrokerConnectionError):
    """The broker refused the client's credentials (SASL_AUTHENTICATION_FAILED,
    UNSUPPORTED_SASL_MECHANISM) or the TLS handshake."""


_PLAINTEXT = ClientSecurity()


class _Protocol(asyncio.BufferedProtocol):
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.reader = FrameReader(MAX_FRAME, "the client's largest response", first_big=MAX_FRAME)
        self.get_buffer = self.reader.get_buffer  # type: ignore[method-assign]  # no call in between
        self.paused = False
        self.drain_waiters: list[asyncio.Future] = []

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self.reader.buffer_updated(nbytes)
        except FrameError as e:
            self.conn.fail(BrokerConnectionError(f"bad frame from {self.conn.addr}: {e}"))
            return
        for frame in frames:
            if self.conn.closed:
                return
            self.conn._on_frame(frame)

    def connection_lost(self, exc) -> None:
        self.conn.fail(BrokerConnectionError(f"connection to {self.conn.addr} lost: {exc or 'closed'}"))
        for w in self.drain_waiters:
            if not w.done():
                w.set_result(None)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        for w in self.drain_waiters:
            if not w.done():
                w.set_result(None)
        self.drain_waiters.clear()


class Connection:
    def __init__(self, host: str, port: int, client_id: str, node_id: int = -1,
                 security: ClientSecurity = _PLAINTEXT) -> None:
        self.host, self.port, self.node_id = host, port, node_id
        self.security = security
        self.addr = f"{host}:{port}"
        self.client_id = client_id
        self.transport: asyncio.Transport | None = None
        self.proto: _Protocol | None = None
        self.pending: deque[tuple[int, int, int, asyncio.Future]] = deque()
        self.correlation = 0
        self.versions: dict[int, tuple[int, int]] = {}  # api key -> usable (min, max)
        self.broker_versions: dict[int, tuple[int, int]] = {}
        # KIP-584: the broker's finalized features and their epoch (ApiVersions v3+)
        self.finalized_features: dict[str, int] = {}
        self.features_epoch = -1
        self.closed = False
        self.error: BaseException | None = None

    async def connect(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            tls = self.security.ssl_context
            transport, self.proto = await asyncio.wait_for(
                loop.create_connection(lambda: _Protocol(self), self.host, self.port, ssl=tls,
                                       server_hostname=self.host if tls is not None else None), timeout_s)
        except ssl.SSLError as e:
            hint = ""
            if any(s in str(e) for s in ("WRONG_VERSION_NUMBER", "wrong version number", "EOF")):
                hint = self._not_tls_hint()
            raise AuthenticationError(f"TLS handshake with {self.addr} failed: {e}{hint}") from None
        except (TimeoutError, OSError) as e:
            # a plaintext listener closes on a ClientHello (a frame far too large): the handshake
            # is reset, which says more about security.protocol than about the network
            hint = "" if tls is None or isinstance(e, (TimeoutError, ConnectionRefusedError)) else self._not_tls_hint()
            raise BrokerConnectionError(f"cannot connect to {self.addr}: {e!r}{hint}") from None
        self.transport = transport
        # A reset that arrived with the handshake has closed the transport already; uvloop then
        # raises RuntimeError from any call on it, which must be the connection error it is.
        try:
            if transport.is_closing():
                raise RuntimeError("closed")
            sock = transport.get_extra_info("socket")
            if sock is not None:
                import socket
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            transport.set_write_buffer_limits(high=4 * 1024 * 1024)
        except (RuntimeError, OSError) as e:
            transport.abort()
            raise BrokerConnectionError(f"connection to {self.addr} closed as it opened: {e!r}") from None
        try:
            await self._negotiate(timeout_s)
        except BrokerConnectionError as e:
            if self.security.ssl_context is not None or isinstance(e, AuthenticationError):
                raise
            # a TLS listener answers a plaintext ApiVersions with an alert (a "frame" too large to
            # be one) or by closing: librdkafka's hint, as Kafka clients give it
            raise BrokerConnectionError(
                f"{e}: disconnected while requesting ApiVersions; the server may expect TLS: check "
                f"security.protocol (it is {self.security.protocol})") from None
        if self.security.uses_sasl:
            await self._authenticate(timeout_s)

    def _not_tls_hint(self) -> str:
        return f"; the server may not expect TLS: check security.protocol (it is {self.security.protocol})"

    async def _authenticate(self, timeout_s: float) -> None:
        """SaslHandshake v1, then one SaslAuthenticate per token (KIP-152)."""
        exchange = SaslExchange(self.security)

        async def call(api_key: int, version: int, **fields):
            body = entities.encode(entities.make(entities.entity_class(api_key, version, "request"), **fields))
            return entities.decode_response(api_key, version,
                                            await asyncio.wait_for(self.request(api_key, version, body), timeout_s))
        hs = await call(ApiKey.SASL_HANDSHAKE, 1, mechanism=exchange.mechanism)
        if int(hs.error_code):
            self.close()
            raise AuthenticationError(f"{self.addr} does not offer SASL mechanism {exchange.mechanism} "
                                      f"(it offers {', '.join(hs.mechanisms)})")
        version = min(2, self.broker_versions.get(ApiKey.SASL_AUTHENTICATE, (0, 0))[1])
        token: bytes | None = exchange.first()
        while token is not None:
            r = await call(ApiKey.SASL_AUTHENTICATE, version, auth_bytes=token)
            if int(r.error_code):
                self.close()
                raise AuthenticationError(f"{self.addr}: {r.error_message or 'SASL authentication failed'}")
            try:
                token = exchange.next(bytes(r.auth_bytes or b""))
            except ValueError as e:
                self.close()
                raise AuthenticationError(f"{self.addr}: {e}") from None

    async def _negotiate(self, timeout_s: float) -> None:
        # v3 first (flexible); a broker that cannot answer it (librdkafka's mock sends a malformed
        # body) or says UNSUPPORTED_VERSION gets v0, which every broker understands
        apis: dict[int, tuple[int, int]] = {}
        try:
            body = await asyncio.wait_for(
                self.request(ApiKey.API_VERSIONS, 3, api_versions.encode_request(3)), timeout_s)
            answer = api_versions.decode_answer(3, body)
            err, apis = answer.error_code, answer.apis
            if err:
                apis = {}
            else:
                self.finalized_features, self.features_epoch = answer.finalized, answer.features_epoch
        except (IndexError, struct.error, UnicodeDecodeError, ValueError):
            apis = {}
        if not apis:
            if self.closed:
                raise self.error or BrokerConnectionError(f"{self.addr} closed during ApiVersions")
            body = await asyncio.wait_for(self.request(ApiKey.API_VERSIONS, 0, b""), timeout_s)
            err, apis = api_versions.decode_response(0, body)
            if err:
                raise BrokerConnectionError(f"ApiVersions to {self.addr} failed with error {err}")
        self.broker_versions = apis
        for key, (lo, hi) in wire.CLIENT_VERSIONS.items():
            b = apis.get(key)
            if b is None:
                continue
            top = min(hi, b[1])
            if top >= max(lo, b[0]):
                self.versions[key] = (max(lo, b[0]), top)

    def version(self, api_key: int) -> int | None:
        v = self.versions.get(api_key)
        return v[1] if v else None

    def send(self, api_key: int, version: int, body: bytes | list, expect_response: bool = True
             ) -> asyncio.Future | None:
        """Write one request now; returns a future of the response body (header stripped).
        `body` may be a list of parts (large Produce requests: written without joining)."""
        if self.closed or self.transport is None:
            raise self.error or BrokerConnectionError(f"connection to {self.addr} is closed")
        self.correlation = (self.correlation + 1) & 0x7FFFFFFF
        cid = self.correlation
        header = headers.request_header(api_key, version, cid, self.client_id)
        if isinstance(body, list):
            size = len(header) + sum(map(len, body))
            self.transport.writelines([_SIZE.pack(size) + header, *body])
        else:
            self.transport.write(b"".join((_SIZE.pack(len(header) + len(body)), header, body)))
        if not expect_response:
            return None
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((cid, api_key, version, fut))
        return fut

    async def request(self, api_key: int, version: int, body: bytes):
        fut = self.send(api_key, version, body)
        assert fut is not None  # a response is expected
        return await fut

    async def drain(self) -> None:
        """Wait while the socket's write buffer is above its high mark."""
        if self.proto is not None and self.proto.paused and not self.closed:
            w = asyncio.get_running_loop().create_future()
            self.proto.drain_waiters.append(w)
            await w

    def _on_frame(self, frame) -> None:
        if len(frame) < 4:
            self.fail(BrokerConnectionError(f"{self.addr}: response of {len(frame)} bytes"))
            return
        cid = _CORR.unpack_from(frame, 0)[0]
        if not self.pending or self.pending[0][0] != cid:
            self.fail(BrokerConnectionError(
                f"{self.addr}: response with correlation id {cid} out of order"))
            return
        _, api_key, version, fut = self.pending.popleft()
        if fut.done():
            return
        try:
            start = headers.response_header_size(api_key, version, frame)
        except (IndexError, struct.error) as e:
            fut.set_exception(BrokerConnectionError(f"{self.addr}: bad response header: {e}"))
            return
        fut.set_result(memoryview(frame)[start:])

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def fail(self, err: BaseException) -> None:
        """Close the connection abruptly: every request waiting on it fails with `err`."""
        if self.closed:
            return
        self.closed = True
        self.error = err
        if self.transport is not None:
            self.transport.abort()
        while self.pending:
            fut = self.pending.popleft()[3]
            if not fut.done():
                fut.set_exception(err)

    def close(self) -> None:
        self.fail(BrokerConnectionError(f"connection to {self.addr} closed by the client"))
