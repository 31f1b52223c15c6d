"""`read_request_header`'s one-unpack parse (issue 38) reads every frame as a field-by-field
Reader does: the same header or the same refusal, for headers of every shape and random bytes."""
from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.protocol.api import is_flexible
from oncelog.protocol.headers import RequestHeader, read_request_header
from oncelog.protocol.primitives import Reader


def reference(frame: memoryview) -> RequestHeader:
    if len(frame) < 8:
        raise ValueError("short")
    r = Reader(frame)
    api_key, version, correlation_id = r.i16(), r.i16(), r.i32()
    client_id = r.string(compact=False) if len(frame) >= 10 else None
    if is_flexible(api_key, version):
        r.skip_tags()
    return RequestHeader(api_key, version, correlation_id, client_id, r.pos)


def outcome(parse, frame: bytes):
    try:
        return parse(memoryview(frame))
    except (ValueError, IndexError, UnicodeDecodeError, struct.error) as e:
        return type(e)


headers = st.builds(
    lambda api, version, cid, client, tail, cut: (
        struct.pack(">hhi", api, version, cid)
        + (struct.pack(">h", -1) if client is None else struct.pack(">h", len(client.encode())) + client.encode())
        + tail)[:cut],
    st.sampled_from([0, 1, 3, 18, 22, 68, 80]), st.integers(0, 15), st.integers(-2**31, 2**31 - 1),
    st.one_of(st.none(), st.text(max_size=12)),
    st.sampled_from([b"", b"\x00", b"\x00rest", b"\x01\x05\x02ab", b"\x02", b"\x01\x05\x09"]),
    st.integers(0, 64))


@settings(max_examples=600, deadline=None)
@given(headers)
def test_a_header_parses_as_the_field_by_field_reader_does(frame):
    assert outcome(read_request_header, frame) == outcome(reference, frame)


@settings(max_examples=600, deadline=None)
@given(st.binary(max_size=24))
def test_random_bytes_parse_or_fail_as_the_field_by_field_reader_does(frame):
    assert outcome(read_request_header, frame) == outcome(reference, frame)
