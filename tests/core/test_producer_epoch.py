"""One epoch ceiling (Short.MAX_VALUE) and Kafka's two rules on it: an idempotent producer bumps
its own epoch up to the ceiling; a transaction coordinator keeps the ceiling for fencing."""
from oncelog.core.producer_epoch import EPOCH_EXHAUSTED_AT, MAX_EPOCH, can_bump_locally, is_epoch_exhausted


def test_the_ceiling_is_an_int16():
    assert MAX_EPOCH == 32767 and EPOCH_EXHAUSTED_AT == MAX_EPOCH - 1


def test_an_idempotent_producer_uses_every_epoch():
    # TransactionManager.bumpIdempotentProducerEpoch: a new id only at Short.MAX_VALUE
    assert can_bump_locally(0) and can_bump_locally(MAX_EPOCH - 1)
    assert not can_bump_locally(MAX_EPOCH)


def test_a_transactional_producer_never_gets_the_last_epoch():
    # TransactionMetadata.isEpochExhausted: producerEpoch >= Short.MaxValue - 1
    assert not is_epoch_exhausted(MAX_EPOCH - 2)
    assert is_epoch_exhausted(MAX_EPOCH - 1) and is_epoch_exhausted(MAX_EPOCH)


def test_a_v2_marker_needs_an_epoch_above_an_open_transaction():
    """KIP-1228: under Transactions V2 the next transaction runs at the epoch the previous one's
    markers carry; a marker at that epoch while it is open is the previous one's, late."""
    from oncelog.core.producer_epoch import marker_error
    from oncelog.protocol.errors import ErrorCode as E

    def code(current, epoch, version, open_here):
        return marker_error(7, current, 3, epoch, 3, version, open_here)[0]
    assert code(5, 6, 2, True) == E.NONE                       # the transaction's own (bumped) marker
    assert code(5, 5, 2, True) == E.INVALID_PRODUCER_EPOCH     # a late one of the transaction before
    assert code(5, 5, 2, False) == E.NONE                      # an exact retry: nothing open (KAFKA-19999)
    assert code(5, 4, 2, False) == E.INVALID_PRODUCER_EPOCH
    assert code(5, 5, 0, True) == E.NONE                       # V1 keeps Kafka's >= (its epoch never moves)
    assert code(5, 5, 1, True) == E.NONE
    assert marker_error(7, 5, 3, 6, 2, 2, True)[0] == E.TRANSACTION_COORDINATOR_FENCED
