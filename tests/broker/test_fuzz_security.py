"""Hypothesis-made SASL exchanges and TLS first flights against a real broker: every connection
ends answered or closed, a connection is served only after a valid exchange, and the broker keeps
serving well-behaved clients afterwards."""
from __future__ import annotations

import socket
import ssl
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.tiers import examples

from oncelog.core.security.plain import client_token
from oncelog.protocol import entities, headers
from oncelog.protocol import metadata as md
from oncelog.protocol.api import ApiKey
from oncelog.testing.raw_client import RawConnection
from oncelog.testing.secure import SecureBroker

pytestmark = pytest.mark.processes

GOOD = client_token("alice", "alice-secret")
TOKENS = [GOOD, client_token("alice", "wrong"), client_token("", "x"), b"", b"n,,n=alice,r=abc",
          b"c=biws,r=abc,p=AAAA", b"\xff\xfe\x00", b"\x00\x00"]
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "", "plain", "X" * 300]


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    b = SecureBroker(tmp_path_factory.mktemp("fuzz-secure")).start()
    yield b
    b.stop()


def request(api_key: int, version: int, corr: int, **fields) -> bytes:
    body = entities.encode(entities.make(entities.entity_class(api_key, version, "request"), **fields))
    hdr = headers.request_header(api_key, version, corr, "fuzz")
    return struct.pack(">i", len(hdr) + len(body)) + hdr + body


def raw(token: bytes) -> bytes:
    return struct.pack(">i", len(token)) + token


@st.composite
def sasl_steps(draw):
    """A list of frames as a client might send them, well- or ill-formed; `sent_good` is whether a
    valid PLAIN exchange is among them (in the order that makes it valid)."""
    frames: list[bytes] = []
    for corr in range(1, draw(st.integers(1, 5)) + 1):
        kind = draw(st.sampled_from(["versions", "handshake", "authenticate", "raw", "metadata", "garbage",
                                     "oversized"]))
        if kind == "versions":
            frames.append(request(ApiKey.API_VERSIONS, 0, corr))
        elif kind == "handshake":
            frames.append(request(ApiKey.SASL_HANDSHAKE, draw(st.integers(0, 1)), corr,
                                  mechanism=draw(st.sampled_from(MECHANISMS))))
        elif kind == "authenticate":
            token = draw(st.sampled_from(TOKENS) | st.binary(max_size=64))
            frames.append(request(ApiKey.SASL_AUTHENTICATE, draw(st.integers(0, 2)), corr, auth_bytes=token))
        elif kind == "raw":
            frames.append(raw(draw(st.sampled_from(TOKENS) | st.binary(max_size=64))))
        elif kind == "metadata":
            frames.append(raw(headers.request_header(ApiKey.METADATA, 12, corr, "fuzz") + md.encode_request(12, None)))
        elif kind == "garbage":
            frames.append(draw(st.binary(min_size=1, max_size=40)))
        else:
            frames.append(struct.pack(">i", draw(st.sampled_from([524289, 2**31 - 1, -1]))))
    if draw(st.booleans()) and frames:   # cut the last frame short
        frames[-1] = frames[-1][:draw(st.integers(0, len(frames[-1])))]
    return frames


def exchange(address: str, frames: list[bytes], tls: ssl.SSLContext | None = None) -> bool:
    """Sends the frames, then a Metadata request; True if that request was answered."""
    c = RawConnection(address, tls, timeout_s=5)
    try:
        c.send_raw(b"".join(frames))
        hdr = headers.request_header(ApiKey.METADATA, 12, 999, "fuzz")
        probe = raw(hdr + md.encode_request(12, None))
        c.send_raw(probe)
        data = b""
        while True:
            chunk = c.sock.recv(65536)
            if not chunk:
                return False
            data += chunk
            if _answers(data, 999):
                return True
    except (TimeoutError, ConnectionError, ssl.SSLError, OSError):
        return False
    finally:
        c.close()


def _answers(data: bytes, corr: int) -> bool:
    """The probe was served: its answer names the broker (an ILLEGAL_SASL_STATE refusal in
    Metadata's format names none)."""
    pos = 0
    while len(data) - pos >= 8:
        size = struct.unpack_from(">i", data, pos)[0]
        if size < 0 or len(data) - pos - 4 < size:
            return False
        if size >= 4 and struct.unpack_from(">i", data, pos + 4)[0] == corr:
            return bool(md.decode_response(12, data[pos + 4:pos + 4 + size], 5).brokers)
        pos += 4 + size
    return False


def login_works(secure: SecureBroker) -> bool:
    frames = [request(ApiKey.SASL_HANDSHAKE, 1, 1, mechanism="PLAIN"),
              request(ApiKey.SASL_AUTHENTICATE, 2, 2, auth_bytes=GOOD)]
    return exchange(secure.address("SASL_PLAINTEXT"), frames)


def test_a_valid_exchange_is_served_and_the_probe_alone_is_not(secure):
    assert login_works(secure)
    assert not exchange(secure.address("SASL_PLAINTEXT"), [])


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(frames=sasl_steps())
def test_fuzzed_sasl_exchanges(secure, frames):
    served = exchange(secure.address("SASL_PLAINTEXT"), frames)
    if served:
        # served only after a handshake and the one good token, in some framing
        assert any(GOOD in f for f in frames), frames
    assert login_works(secure)


def client_hello() -> bytes:
    """A real TLS 1.3/1.2 ClientHello, as a client's first flight."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


HELLO = client_hello()


@st.composite
def first_flights(draw):
    data = bytearray(HELLO)
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[pos] ^= draw(st.integers(1, 255))
        elif kind == "truncate":
            del data[pos:]
        else:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data) if draw(st.booleans()) else draw(st.binary(max_size=600))


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(flight=first_flights(), listener=st.sampled_from(["SASL_SSL", "SSL"]))
def test_fuzzed_tls_first_flights(secure, flight, listener):
    c = RawConnection(secure.address(listener), timeout_s=5)   # TLS bytes by hand: no TLS context
    try:
        c.send_raw(flight)
        c.sock.shutdown(socket.SHUT_WR)
        while c.sock.recv(65536):
            pass
    except (TimeoutError, ConnectionError, OSError):
        pass
    finally:
        c.close()
    good = ssl.create_default_context(cafile=str(secure.pki.ca))
    frames = [request(ApiKey.SASL_HANDSHAKE, 1, 1, mechanism="PLAIN"),
              request(ApiKey.SASL_AUTHENTICATE, 2, 2, auth_bytes=GOOD)]
    assert exchange(secure.address("SASL_SSL"), frames, good)
