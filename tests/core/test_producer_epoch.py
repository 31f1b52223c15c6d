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
