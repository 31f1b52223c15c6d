"""ApiVersions written by hand for the client's side of the handshake, and the v0 answer every
client can read: a broker answers a version above its own in v0 (its response header stays v0 in
every version), so that the client can retry with one it serves."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from oncelog.protocol.primitives import I16, I32, Buf, Reader, string

TAG_FINALIZED_FEATURES_EPOCH = 1
TAG_FINALIZED_FEATURES = 2

CLIENT_SOFTWARE_NAME = "oncelog"
CLIENT_SOFTWARE_VERSION = "0.1.0"


def encode_request(version: int) -> bytes:
    if version >= 3:
        return (string(CLIENT_SOFTWARE_NAME, True) + string(CLIENT_SOFTWARE_VERSION, True) + b"\x00")
    return b""


@dataclass
class ApiVersionsAnswer:
    error_code: int
    apis: dict[int, tuple[int, int]]                          # api key -> (min, max)
    finalized: dict[str, int] = field(default_factory=dict)   # feature -> finalized max level
    features_epoch: int = -1                                  # FinalizedFeaturesEpoch (-1: none)


def decode_response(version: int, body: Buf) -> tuple[int, dict[int, tuple[int, int]]]:
    """(error code, {api key: (min version, max version)})."""
    answer = decode_answer(version, body)
    return answer.error_code, answer.apis


def decode_answer(version: int, body: Buf) -> ApiVersionsAnswer:
    """The whole answer; from v3 with the finalized features (KIP-584) of its tagged fields."""
    flex = version >= 3
    r = Reader(body)
    code = r.i16()
    apis = {}
    for _ in range(r.array_len(flex)):
        key, lo, hi = r.i16(), r.i16(), r.i16()
        if flex:
            r.skip_tags()
        apis[key] = (lo, hi)
    answer = ApiVersionsAnswer(code, apis)
    if not flex or r.pos >= len(body):
        return answer
    r.i32()   # throttle time
    tags = r.tags()
    if TAG_FINALIZED_FEATURES_EPOCH in tags:
        answer.features_epoch = Reader(tags[TAG_FINALIZED_FEATURES_EPOCH]).i64()
    if TAG_FINALIZED_FEATURES in tags:
        f = Reader(tags[TAG_FINALIZED_FEATURES])
        for _ in range(f.array_len(True)):
            name, top, _low = f.string(True), f.i16(), f.i16()
            f.skip_tags()
            if name is not None:
                answer.finalized[name] = top
    return answer


def encode_v0_response(error_code: int, versions: Mapping[int, tuple[int, int]]) -> bytes:
    out = [I16.pack(error_code), I32.pack(len(versions))]
    for key, (lo, hi) in sorted(versions.items()):
        out.append(I16.pack(key) + I16.pack(lo) + I16.pack(hi))
    return b"".join(out)
