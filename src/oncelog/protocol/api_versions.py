"""ApiVersions written by hand for the client's side of the handshake, and the v0 answer every
client can read: a broker answers a version above its own in v0 (its response header stays v0 in
every version), so that the client can retry with one it serves."""
from __future__ import annotations

from collections.abc import Mapping

from oncelog.protocol.primitives import I16, I32, Buf, Reader, string

CLIENT_SOFTWARE_NAME = "oncelog"
CLIENT_SOFTWARE_VERSION = "0.1.0"


def encode_request(version: int) -> bytes:
    if version >= 3:
        return (string(CLIENT_SOFTWARE_NAME, True) + string(CLIENT_SOFTWARE_VERSION, True) + b"\x00")
    return b""


def decode_response(version: int, body: Buf) -> tuple[int, dict[int, tuple[int, int]]]:
    """(error code, {api key: (min version, max version)})."""
    flex = version >= 3
    r = Reader(body)
    code = r.i16()
    apis = {}
    for _ in range(r.array_len(flex)):
        key, lo, hi = r.i16(), r.i16(), r.i16()
        if flex:
            r.skip_tags()
        apis[key] = (lo, hi)
    return code, apis


def encode_v0_response(error_code: int, versions: Mapping[int, tuple[int, int]]) -> bytes:
    out = [I16.pack(error_code), I32.pack(len(versions))]
    for key, (lo, hi) in sorted(versions.items()):
        out.append(I16.pack(key) + I16.pack(lo) + I16.pack(hi))
    return b"".join(out)
