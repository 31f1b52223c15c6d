"""The raw wire client of the tests: a Kafka-protocol connection that sends exactly what a test
(or an attacker) writes: frames of any size, requests in any order, logins no client library
would attempt; and asks whether the other side closed it.

`RawConnection` blocks (a broker in another process); `AsyncRawConnection` is the same on an
asyncio stream, for a test whose broker runs on its own event loop (`testing.in_process`). Both
frame requests and read responses with the same two functions."""
from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import time

from oncelog.core.security.plain import client_token
from oncelog.protocol import entities, headers
from oncelog.protocol.api import ApiKey

_SIZE = struct.Struct(">i")
CLIENT_ID = "raw-client"


def request_frame(api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    """A request with its header (v1, or v2 for a flexible version), behind its size."""
    header = headers.request_header(api_key, version, correlation, CLIENT_ID)
    return _SIZE.pack(len(header) + len(body)) + header + body


def response_body(api_key: int, version: int, frame: bytes, correlation: int) -> bytes:
    """A response frame (without its size) after its header, whose correlation id must be `correlation`."""
    assert _SIZE.unpack(frame[:4])[0] == correlation, "a response out of order"
    return frame[headers.response_header_size(api_key, version, frame):]


def request_body(api_key: int, version: int, fields: dict) -> bytes:
    return entities.encode(entities.make(entities.entity_class(api_key, version, "request"), **fields))


class RawConnection:
    def __init__(self, address: str, tls: ssl.SSLContext | None = None, timeout_s: float = 10) -> None:
        host, port = address.rsplit(":", 1)
        raw = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.sock = tls.wrap_socket(raw, server_hostname="localhost") if tls is not None else raw
        self.timeout_s = timeout_s
        self.correlation = 0

    # ------------------------------------------------------------------ sending
    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, payload: bytes) -> None:
        """`payload` behind its size, whatever it holds (a SASL v0 token, a request by hand)."""
        self.sock.sendall(_SIZE.pack(len(payload)) + payload)

    def send(self, api_key: int, version: int, body: bytes) -> int:
        self.correlation += 1
        self.sock.sendall(request_frame(api_key, version, self.correlation, body))
        return self.correlation

    def exchange(self, api_key: int, version: int, body: bytes) -> bytes:
        """Send a request with `body`; its response's body (after the header, whose correlation
        id must be the request's)."""
        correlation = self.send(api_key, version, body)
        return response_body(api_key, version, self.recv_frame(), correlation)

    def call(self, api_key: int, version: int, **fields):
        """Send a request made of `fields`, return its decoded response."""
        return entities.decode_response(api_key, version, self.exchange(api_key, version,
                                                                        request_body(api_key, version, fields)))

    def api_versions(self) -> int:
        """ApiVersions v0 (empty request, every broker answers it): its error code."""
        self.send(ApiKey.API_VERSIONS, 0, b"")
        frame = self.recv_frame()
        return struct.unpack(">h", frame[4:6])[0]

    def plain_login(self, user: str, password: str) -> int:
        """SaslHandshake v1 for PLAIN, then SaslAuthenticate v2: its error code."""
        assert int(self.call(ApiKey.SASL_HANDSHAKE, 1, mechanism="PLAIN").error_code) == 0
        return int(self.call(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=client_token(user, password)).error_code)

    # ------------------------------------------------------------------ receiving
    def recv_frame(self) -> bytes:
        return self._exact(_SIZE.unpack(self._exact(4))[0])

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the peer")
            buf += chunk
        return buf

    def closed_within(self, timeout_s: float, *, quietly: bool = False) -> bool:
        """True once the peer closes (EOF or reset) within `timeout_s`; False if it stays open.
        Bytes that arrive meanwhile are read and dropped, or, with `quietly`, are an answer: the
        peer did not close without one (False)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 if quietly else 4096)
                if data == b"":
                    return True
                if quietly:
                    return False
            except TimeoutError:
                return False
            except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
                return True
            finally:
                self.sock.settimeout(self.timeout_s)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncRawConnection:
    """`RawConnection` on an asyncio stream: requests in order, one answer at a time; a peer that
    closes raises asyncio.IncompleteReadError (an EOFError)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.correlation = 0

    @classmethod
    async def open(cls, host: str, port: int) -> AsyncRawConnection:
        return cls(*await asyncio.open_connection(host, port))

    async def exchange(self, api_key: int, version: int, body: bytes) -> bytes:
        self.correlation += 1
        self.writer.write(request_frame(api_key, version, self.correlation, body))
        await self.writer.drain()
        size = _SIZE.unpack(await self.reader.readexactly(4))[0]
        return response_body(api_key, version, await self.reader.readexactly(size), self.correlation)

    async def call(self, api_key: int, version: int, **fields):
        return entities.decode_response(api_key, version, await self.exchange(api_key, version,
                                                                              request_body(api_key, version, fields)))

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()
