"""ListTransactionsResponse written by hand (`protocol.list_transactions`) is byte for byte what
kio writes, at every version served."""
from __future__ import annotations

import pytest

from oncelog.protocol import entities
from oncelog.protocol import list_transactions as wire
from oncelog.protocol.api import BROKER_VERSIONS, ApiKey

K = ApiKey.LIST_TRANSACTIONS
STATES = [("a", 7, "Ongoing"), ("é-ü" * 50, 2**62, "CompleteCommit"), ("", -1, "Empty")]


@pytest.mark.parametrize("version", range(BROKER_VERSIONS[K][0], BROKER_VERSIONS[K][1] + 1))
@pytest.mark.parametrize("unknown,states", [((), []), (("Nope", "Other"), STATES), ((), STATES * 300)])
def test_the_hand_written_response_is_kios(version, unknown, states):
    rb = entities.ResponseBuilder(K, version)
    expected = rb.encode(throttle_time=0, error_code=14, unknown_state_filters=tuple(unknown), transaction_states=tuple(
        rb("TransactionState", transactional_id=t, producer_id=p, transaction_state=s) for t, p, s in states))
    assert wire.encode_response(0, 14, unknown, [wire.encode_state(*s) for s in states]) == expected
    decoded = entities.decode_response(K, version, expected)
    assert [(d.transactional_id, d.producer_id, d.transaction_state) for d in decoded.transaction_states] == states
