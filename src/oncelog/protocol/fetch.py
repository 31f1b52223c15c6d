"""FetchResponse v4-v12 written by hand: record bytes go from the log into the response without
being decoded or copied into an entity."""
from __future__ import annotations

from dataclasses import dataclass

from oncelog.protocol.primitives import I16, I32, I64, array_len, bytes_len, string


@dataclass(slots=True)
class PartitionData:
    index: int
    error_code: int = 0
    high_watermark: int = -1
    log_start_offset: int = -1
    records: bytes = b""


def encode_response(version: int, topics: list[tuple[str, list[PartitionData]]],
                    error_code: int = 0, session_id: int = 0, throttle_ms: int = 0) -> bytes:
    flex = version >= 12
    out = [I32.pack(throttle_ms)]
    if version >= 7:
        out.append(I16.pack(error_code) + I32.pack(session_id))
    out.append(array_len(len(topics), flex))
    for name, parts in topics:
        out.append(string(name, flex))
        out.append(array_len(len(parts), flex))
        for p in parts:
            # last stable offset = high watermark: oncelog has no open transactions
            out.append(I32.pack(p.index) + I16.pack(p.error_code) + I64.pack(p.high_watermark)
                       + I64.pack(p.high_watermark))
            if version >= 5:
                out.append(I64.pack(p.log_start_offset))
            out.append(array_len(0, flex))  # aborted transactions: none
            if version >= 11:
                out.append(I32.pack(-1))  # preferred read replica: none
            out.append(bytes_len(len(p.records), flex))
            out.append(p.records)
            if flex:
                out.append(b"\x00")
        if flex:
            out.append(b"\x00")
    if flex:
        out.append(b"\x00")
    return b"".join(out)
