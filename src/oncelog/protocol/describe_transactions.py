"""DescribeTransactionsResponse (API 65, v0, flexible) written by hand: a transaction lists every
partition it holds, which a client that may write to many partitions makes long (200 transactions
of 2,000 partitions described at once are 400,000 entries, seconds to build and encode through kio
in one step of the event loop). Each transaction is encoded on its own (`encode_state`), so that a
handler can spread them over steps, and `encode_response` joins them."""
from __future__ import annotations

import struct
from collections.abc import Sequence

from oncelog.protocol.primitives import I16, I32, I64, array_len, string

_NO_TAGS = b"\x00"


def encode_state(error_code: int, transactional_id: str, state: str, timeout_ms: int, start_ms: int,
                 producer_id: int, producer_epoch: int, topics: Sequence[tuple[str, Sequence[int]]]) -> bytes:
    """One TransactionState with its partitions by topic."""
    out = [I16.pack(error_code), string(transactional_id, True), string(state, True), I32.pack(timeout_ms),
           I64.pack(start_ms), I64.pack(producer_id), I16.pack(producer_epoch), array_len(len(topics), True)]
    for topic, partitions in topics:
        out += (string(topic, True), array_len(len(partitions), True),
                struct.pack(f">{len(partitions)}i", *partitions), _NO_TAGS)
    out.append(_NO_TAGS)
    return b"".join(out)


def encode_response(throttle_ms: int, states: Sequence[bytes]) -> bytes:
    return b"".join((I32.pack(throttle_ms), array_len(len(states), True), *states, _NO_TAGS))
