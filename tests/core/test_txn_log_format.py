"""`__transaction_state` records: Kafka's TransactionLogKey/Value bytes, our extra tag, refusals;
and Java's String.hashCode that maps ids to partitions."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncelog.core.txn.log_format import (
    decode_key,
    decode_value,
    encode_key,
    encode_record,
    encode_value,
    java_string_hash,
    kafka_abs,
    partition_for,
)
from oncelog.core.txn.state import PERSISTED, TransactionMetadata, TxnState

S = TxnState


def test_java_string_hash_matches_java():
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -2**31  # Integer.MIN_VALUE
    assert java_string_hash("\U0001F600") == 31 * 0xD83D + 0xDE00  # a surrogate pair: two units
    assert java_string_hash("ä") == 0xE4


def test_partition_for_uses_kafkas_abs():
    assert kafka_abs(-2**31) == 0 and kafka_abs(-5) == 5
    assert partition_for("polygenelubricants", 50) == 0
    assert partition_for("hello", 50) == 99162322 % 50
    neg = next(s for s in (f"transactional-id-{i}" for i in range(1000)) if java_string_hash(s) < 0)
    assert partition_for(neg, 50) == (-java_string_hash(neg)) % 50


def test_key_bytes():
    assert encode_key("app-1") == b"\x00\x00\x00\x05app-1"
    assert decode_key(b"\x00\x00\x00\x05app-1") == "app-1"
    for bad in (b"\x00\x01\x00\x05app-1", b"\x00\x00\x00\x09app-1", b"\x00\x00\xff\xff",
                b"\x00\x00\x00\x01ab", b"\x00"):
        with pytest.raises(ValueError):
            decode_key(bad)


def test_value_v1_bytes_follow_kafkas_schema():
    meta = TransactionMetadata("app-1", 5, 2, 60_000, S.ONGOING, frozenset({("t", 1), ("t", 0)}),
                               start_ms=50, update_ms=100, last_producer_id=5)
    expected = (b"\x00\x01" + struct.pack(">qhib", 5, 2, 60_000, 1)
                + b"\x02" + b"\x02t" + b"\x03" + struct.pack(">ii", 0, 1) + b"\x00"
                + struct.pack(">qq", 100, 50)
                + b"\x01" + b"\x00\x08" + struct.pack(">q", 5))
    assert encode_value(meta) == expected
    assert decode_value("app-1", expected) == meta


def test_value_carries_the_last_epoch_in_oncelogs_tag():
    meta = TransactionMetadata("a", 5, 3, 1000, S.EMPTY, update_ms=7, last_producer_id=5, last_producer_epoch=2)
    raw = encode_value(meta)
    assert raw.endswith(b"\x02\x00\x08" + struct.pack(">q", 5) + b"\x90\x4e\x02" + struct.pack(">h", 2))
    assert decode_value("a", raw) == meta


def test_value_v0_loads():
    raw = (b"\x00\x00" + struct.pack(">qhib", 9, 1, 1000, 2) + struct.pack(">i", 1) + b"\x00\x01t"
           + struct.pack(">iii", 2, 3, 4) + struct.pack(">qq", 20, 10))
    assert decode_value("x", raw) == TransactionMetadata("x", 9, 1, 1000, S.PREPARE_COMMIT,
                                                        frozenset({("t", 3), ("t", 4)}), 10, 20)


def test_empty_state_has_a_null_partition_list():
    raw = encode_value(TransactionMetadata("a", 1, 0, 1000, S.EMPTY, update_ms=1))
    assert raw[17] == 0  # compact null array right after the status byte
    with pytest.raises(ValueError):
        encode_value(TransactionMetadata("a", 1, 0, 1000, S.EMPTY, frozenset({("t", 0)})))


def test_tombstone():
    assert encode_record("a", None) == (encode_key("a"), None)
    assert decode_value("a", None) is None


@pytest.mark.parametrize("state", [S.DEAD, S.PREPARE_EPOCH_FENCE])
def test_states_never_written(state):
    with pytest.raises(ValueError):
        encode_value(TransactionMetadata("a", 1, 0, 1000, state))
    raw = bytearray(encode_value(TransactionMetadata("a", 1, 0, 1000, S.COMPLETE_ABORT)))
    raw[16] = int(state)
    with pytest.raises(ValueError):
        decode_value("a", bytes(raw))


@pytest.mark.parametrize("mutate", [
    lambda r: b"\x00\x02" + r[2:],              # unknown version
    lambda r: r[:16] + b"\x08" + r[17:],       # state id 8
    lambda r: r[:16] + b"\xff" + r[17:],       # state id -1
    lambda r: r + b"\x00",                     # trailing bytes
    lambda r: r[:-3],                          # cut short
    lambda r: r[:2] + struct.pack(">q", -4) + r[10:],  # negative producer id
    lambda r: r[:10] + struct.pack(">h", -1) + r[12:],  # negative epoch
])
def test_bad_values_are_refused(mutate):
    raw = encode_value(TransactionMetadata("a", 1, 0, 1000, S.ONGOING, frozenset({("t", 0)}), 5, 6))
    with pytest.raises(ValueError):
        decode_value("a", mutate(raw))


metas = st.builds(
    TransactionMetadata,
    transactional_id=st.text(min_size=1, max_size=20),
    producer_id=st.integers(0, 2**63 - 1),
    producer_epoch=st.integers(0, 2**15 - 1),
    timeout_ms=st.integers(1, 2**31 - 1),
    state=st.sampled_from(sorted(PERSISTED)),
    partitions=st.frozensets(st.tuples(st.text(min_size=1, max_size=8), st.integers(0, 2**31 - 1)), max_size=6),
    start_ms=st.integers(-1, 2**62),
    update_ms=st.integers(-1, 2**62),
    last_producer_id=st.integers(-1, 2**63 - 1),
    last_producer_epoch=st.integers(-1, 2**15 - 1),
)


@given(metas)
def test_round_trip(meta):
    if meta.state == S.EMPTY:
        meta = meta.evolve(partitions=frozenset())
    key, value = encode_record(meta.transactional_id, meta)
    assert decode_key(key) == meta.transactional_id
    assert decode_value(meta.transactional_id, value) == meta


@given(st.binary(max_size=64))
def test_garbage_never_crashes_the_decoder(raw):
    try:
        decode_value("a", raw)
    except ValueError:
        pass
    try:
        decode_key(raw)
    except ValueError:
        pass
