"""Request header v0-v2 and response header v0-v1.

Request header v1 has the client id; v2 (flexible APIs) adds tagged fields. Response header v1
(flexible APIs) adds tagged fields, except for ApiVersions whose response header stays v0 so that
a client can always read the answer to a version it guessed too high.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from oncelog.protocol.api import ApiKey, is_flexible
from oncelog.protocol.primitives import I32, Buf, Reader, string

_REQUEST_HEAD = struct.Struct(">hhi")
_REQUEST_HEAD_AND_ID = struct.Struct(">hhih")   # ... and the client id's length


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int  # where the request body starts in the frame


def read_request_header(frame: Buf) -> RequestHeader:
    """Parse the header; raises ValueError on a frame too short to hold one. One unpack for the
    fixed fields and the client id's length (every request pays for this: a Reader's five
    calls took 4 microseconds, issue 38)."""
    size = len(frame)
    if size < 8:
        raise ValueError(f"request of {size} bytes is shorter than a request header")
    if size < 10:
        api_key, version, correlation_id = _REQUEST_HEAD.unpack_from(frame)
        client_id, pos = None, 8
    else:
        api_key, version, correlation_id, n = _REQUEST_HEAD_AND_ID.unpack_from(frame)
        pos = 10
        client_id = None
        if n >= 0:
            if n > size - pos:
                raise ValueError(f"field of {n} bytes runs past the end of the message")
            client_id = bytes(frame[pos:pos + n]).decode()
            pos += n
    if is_flexible(api_key, version):
        if pos < size and frame[pos] == 0:
            pos += 1   # no tagged fields, as nearly always
        else:
            r = Reader(frame, pos)
            r.skip_tags()
            pos = r.pos
    return RequestHeader(api_key, version, correlation_id, client_id, pos)


def request_header(api_key: int, version: int, correlation_id: int, client_id: str | None) -> bytes:
    """Request header v1, or v2 (an empty tagged-field section) for a flexible version."""
    header = _REQUEST_HEAD.pack(api_key, version, correlation_id) + string(client_id, False)
    return header + b"\x00" if is_flexible(api_key, version) else header


def response_header(api_key: int, version: int, correlation_id: int) -> bytes:
    if api_key != ApiKey.API_VERSIONS and is_flexible(api_key, version):
        return I32.pack(correlation_id) + b"\x00"
    return I32.pack(correlation_id)


def response_header_size(api_key: int, version: int, frame: Buf) -> int:
    """Bytes of the response header at the start of `frame` (its correlation id is the first four)."""
    if api_key == ApiKey.API_VERSIONS or not is_flexible(api_key, version):
        return 4
    r = Reader(frame, 4)
    r.skip_tags()
    return r.pos


def correlation_id_of(frame: Buf) -> int | None:
    """Best effort for logging a frame whose header does not parse."""
    return I32.unpack_from(frame, 4)[0] if len(frame) >= 8 else None

