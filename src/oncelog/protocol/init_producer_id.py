"""InitProducerId written by hand for the client: a request of a few fields, and a response whose
error code is read as an integer, so that a code this version does not know (a newer broker's) is
reported with its number instead of failing the decode."""
from __future__ import annotations

from oncelog.protocol.primitives import I16, I32, I64, Buf, Reader, string

# what the Java idempotent producer sends as transaction timeout without a transactional id
NO_TRANSACTION_TIMEOUT_MS = 2**31 - 1


def encode_request(version: int, producer_id: int = -1, producer_epoch: int = -1, *,
                   transactional_id: str | None = None,
                   transaction_timeout_ms: int = NO_TRANSACTION_TIMEOUT_MS) -> bytes:
    """v3+ names the caller's current producer id and epoch (-1/-1 for a new producer)."""
    flex = version >= 2
    out = [string(transactional_id, flex), I32.pack(transaction_timeout_ms)]
    if version >= 3:
        out.append(I64.pack(producer_id) + I16.pack(producer_epoch))
    if flex:
        out.append(b"\x00")
    return b"".join(out)


def decode_response(version: int, body: Buf, pos: int = 0) -> tuple[int, int, int]:
    """(error code, producer id, epoch)."""
    r = Reader(body, pos)
    r.i32()  # throttle time
    return r.i16(), r.i64(), r.i16()
