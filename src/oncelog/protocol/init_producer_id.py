"""InitProducerId written by hand for the client: a request of a few fields, and a response whose
error code is read as an integer, so that a code this version does not know (a newer broker's) is
reported with its number instead of failing the decode."""
from __future__ import annotations

from oncelog.protocol.primitives import I16, I32, I64, Buf, Reader, string

# what the Java idempotent producer sends as transaction timeout without a transactional id
NO_TRANSACTION_TIMEOUT_MS = 2**31 - 1


def encode_request(version: int, producer_id: int = -1, producer_epoch: int = -1, *,
                   transactional_id: str | None = None,
                   transaction_timeout_ms: int = NO_TRANSACTION_TIMEOUT_MS,
                   enable_2pc: bool = False, keep_prepared_txn: bool = False) -> bytes:
    """v3+ names the caller's current producer id and epoch (-1/-1 for a new producer); v6 adds
    KIP-939's Enable2Pc and KeepPreparedTxn (refused below v6: they would be lost)."""
    if (enable_2pc or keep_prepared_txn) and version < 6:
        raise ValueError(f"InitProducerId v{version} cannot ask for two-phase commit (v6+)")
    flex = version >= 2
    out = [string(transactional_id, flex), I32.pack(transaction_timeout_ms)]
    if version >= 3:
        out.append(I64.pack(producer_id) + I16.pack(producer_epoch))
    if version >= 6:
        out.append(bytes((int(enable_2pc), int(keep_prepared_txn))))
    if flex:
        out.append(b"\x00")
    return b"".join(out)


def decode_response(version: int, body: Buf, pos: int = 0) -> tuple[int, int, int]:
    """(error code, producer id, epoch)."""
    r = Reader(body, pos)
    r.i32()  # throttle time
    return r.i16(), r.i64(), r.i16()


def decode_ongoing(version: int, body: Buf, pos: int = 0) -> tuple[int, int]:
    """v6: (OngoingTxnProducerId, OngoingTxnProducerEpoch), the transaction KeepPreparedTxn kept;
    (-1, -1) below v6 or when none."""
    if version < 6:
        return -1, -1
    r = Reader(body, pos)
    r.i32()
    r.i16()
    r.i64()
    r.i16()
    return r.i64(), r.i16()
