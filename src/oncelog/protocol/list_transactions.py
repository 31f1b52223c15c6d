"""ListTransactionsResponse (API 66, v0-v1, both flexible) written by hand: its answer lists every
transactional id the caller may describe, which a principal with WRITE on many ids makes long
(20,000 entries took 0.4 s to build and encode through kio, in one step of the event loop). Each
entry is encoded on its own (`encode_state`), so that a handler can spread them over steps, and
`encode_response` joins them."""
from __future__ import annotations

from collections.abc import Sequence

from oncelog.protocol.primitives import I16, I32, I64, array_len, string

_NO_TAGS = b"\x00"


def encode_state(transactional_id: str, producer_id: int, state: str) -> bytes:
    """One TransactionState: id, producer id, the state's name, no tagged fields."""
    return b"".join((string(transactional_id, True), I64.pack(producer_id), string(state, True), _NO_TAGS))


def encode_response(throttle_ms: int, error_code: int, unknown_state_filters: Sequence[str],
                    states: Sequence[bytes]) -> bytes:
    """The body of a response (v0 and v1 are alike) from entries `encode_state` made."""
    return b"".join((I32.pack(throttle_ms), I16.pack(error_code), array_len(len(unknown_state_filters), True),
                     *(string(s, True) for s in unknown_state_filters), array_len(len(states), True), *states,
                     _NO_TAGS))
