"""A blocking Kafka-protocol connection that sends exactly what a test (or an attacker) writes:
frames of any size, requests in any order, logins no client library would attempt; and asks
whether the other side closed it. The one raw wire client of the tests (a test on the broker's
own event loop runs its calls on a thread: `asyncio.to_thread`)."""
from __future__ import annotations

import socket
import ssl
import struct
import time

from oncelog.core.security.plain import client_token
from oncelog.protocol import entities, headers
from oncelog.protocol.api import ApiKey

_SIZE = struct.Struct(">i")


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
        header = headers.request_header(api_key, version, self.correlation, "raw-client")
        self.sock.sendall(_SIZE.pack(len(header) + len(body)) + header + body)
        return self.correlation

    def exchange(self, api_key: int, version: int, body: bytes) -> bytes:
        """Send a request with `body`; its response's body (after the header, whose correlation
        id must be the request's)."""
        correlation = self.send(api_key, version, body)
        frame = self.recv_frame()
        assert _SIZE.unpack(frame[:4])[0] == correlation, "a response out of order"
        return frame[headers.response_header_size(api_key, version, frame):]

    def call(self, api_key: int, version: int, **fields):
        """Send a request made of `fields`, return its decoded response."""
        body = entities.encode(entities.make(entities.entity_class(api_key, version, "request"), **fields))
        return entities.decode_response(api_key, version, self.exchange(api_key, version, body))

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
