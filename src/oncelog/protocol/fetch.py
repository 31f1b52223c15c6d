"""FetchResponse v4-v12 written by hand, in both directions: record bytes go from the log into the
response without being decoded or copied into an entity, and come out of it as views.

Error codes are read as the integers they are, per partition: a code this version does not know (a
newer broker's) is that partition's error, and the other partitions of the response are read as
usual (`protocol.errors.error_code` names it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from oncelog.protocol.primitives import I16, I32, I64, Buf, Reader, array_len, bytes_len, string


class OpaqueRecords(Protocol):
    """Record bytes this module frames by their length without reading them: a region of a log
    file that the broker's connection sends as it is (`storage.segment.FileRegion`)."""

    def __len__(self) -> int: ...


Records = Buf | OpaqueRecords


@dataclass(slots=True)
class PartitionData:
    index: int
    error_code: int = 0
    high_watermark: int = -1
    log_start_offset: int = -1
    records: Records = b""
    last_stable_offset: int = -1  # -1: answered as the high watermark
    # (producer id, first offset) of the aborted transactions overlapping the records; None (a
    # null array, as Kafka answers read_uncommitted) or a list (read_committed)
    aborted_transactions: list[tuple[int, int]] | None = None


@dataclass(slots=True)
class FetchResponse:
    error_code: int = 0   # v7+: the whole request's (e.g. a fetch session's) error
    session_id: int = 0
    topics: list[tuple[str, list[PartitionData]]] = field(default_factory=list)


def encode_response(version: int, topics: list[tuple[str, list[PartitionData]]],
                    error_code: int = 0, session_id: int = 0, throttle_ms: int = 0) -> bytes:
    """The response body as one bytes object (every partition's records must be bytes)."""
    parts = encode_response_parts(version, topics, error_code, session_id, throttle_ms)
    if len(parts) == 1 and isinstance(parts[0], bytes):
        return parts[0]
    raise TypeError("encode_response needs record sets of bytes: use encode_response_parts")


def encode_response_parts(version: int, topics: list[tuple[str, list[PartitionData]]], error_code: int = 0,
                          session_id: int = 0, throttle_ms: int = 0) -> list[bytes | OpaqueRecords]:
    """The response body as bytes and, in their places, the partitions' record sets that are not
    bytes (`OpaqueRecords`), untouched: what lies between them is joined, so a response of one
    partition is three parts, and one whose records are all bytes is one."""
    flex = version >= 12
    parts: list[bytes | OpaqueRecords] = []
    out: list[Buf] = [I32.pack(throttle_ms)]
    if version >= 7:
        out.append(I16.pack(error_code) + I32.pack(session_id))
    out.append(array_len(len(topics), flex))
    for name, parts_of_topic in topics:
        out.append(string(name, flex))
        out.append(array_len(len(parts_of_topic), flex))
        for p in parts_of_topic:
            lso = p.last_stable_offset if p.last_stable_offset >= 0 else p.high_watermark
            out.append(I32.pack(p.index) + I16.pack(p.error_code) + I64.pack(p.high_watermark)
                       + I64.pack(lso))
            if version >= 5:
                out.append(I64.pack(p.log_start_offset))
            aborted = p.aborted_transactions
            if aborted is None:
                out.append(array_len(None, flex))
            else:
                out.append(array_len(len(aborted), flex))
                tag = b"\x00" if flex else b""
                out.extend(I64.pack(pid) + I64.pack(first) + tag for pid, first in aborted)
            if version >= 11:
                out.append(I32.pack(-1))  # preferred read replica: none
            records = p.records
            out.append(bytes_len(len(records), flex))
            if isinstance(records, (bytes, bytearray, memoryview)):
                out.append(records)
            else:
                parts.append(b"".join(out))
                parts.append(records)
                out = []
            if flex:
                out.append(b"\x00")
        if flex:
            out.append(b"\x00")
    if flex:
        out.append(b"\x00")
    parts.append(b"".join(out))
    return parts


def decode_response(version: int, body: Buf) -> FetchResponse:
    """A FetchResponse body; each partition's records are a view into `body`."""
    flex = version >= 12
    r = Reader(body)
    r.i32()  # throttle time
    response = FetchResponse()
    if version >= 7:
        response.error_code, response.session_id = r.i16(), r.i32()
    for _ in range(r.array_len(flex)):
        name = r.string(flex) or ""
        parts = []
        for _ in range(r.array_len(flex)):
            p = PartitionData(r.i32(), r.i16(), r.i64())
            p.last_stable_offset = r.i64()
            if version >= 5:
                p.log_start_offset = r.i64()
            n = r.array_len(flex)
            if n >= 0:
                aborted: list[tuple[int, int]] = []
                for _ in range(n):
                    aborted.append((r.i64(), r.i64()))
                    if flex:
                        r.skip_tags()
                p.aborted_transactions = aborted
            if version >= 11:
                r.i32()  # preferred read replica
            records = r.bytes_view(flex)
            p.records = records if records is not None else b""
            if flex:
                r.skip_tags()
            parts.append(p)
        if flex:
            r.skip_tags()
        response.topics.append((name, parts))
    return response
