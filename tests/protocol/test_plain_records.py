"""The producer's batch encoder for keyless, headerless records equals the record-by-record one,
on each of its paths: values of one size with one-byte timestamp deltas, any sizes and deltas
within the varint cache, and the rest (None values, long deltas, large values)."""
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.tiers import examples

from oncelog.protocol.records import HEADER_ROOM, encode_plain_records, encode_record

# values are drawn as (size, fill byte): large values without drawing every byte
_SIZES = st.integers(0, 300) | st.integers(16250, 16400)
_VALUE = st.builds(lambda n, b: bytes([b]) * n, _SIZES, st.integers(0, 255))


def _check(values, deltas):
    want = b"".join(encode_record(i, d, None, v) for i, (v, d) in enumerate(zip(values, deltas)))
    assert encode_plain_records(values, deltas) == want
    if values:   # laid out behind room for a batch header (seal_batch writes it)
        assert encode_plain_records(values, deltas, header_room=True) == HEADER_ROOM + want


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.none() | _VALUE, st.integers(-2**40, 2**40) | st.integers(0, 20000)),
                max_size=60))
def test_any_records(recs):
    _check([v for v, _ in recs], [d for _, d in recs])


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(_VALUE, st.integers(0, 16383)), min_size=1, max_size=60))
def test_values_and_deltas_within_the_varint_cache(recs):
    _check([v for v, _ in recs], [d for _, d in recs])


@settings(max_examples=examples(200), deadline=None)
@given(_SIZES, st.lists(st.tuples(st.integers(0, 255), st.integers(0, 63) | st.integers(64, 200)),
                        min_size=1, max_size=400))
def test_values_of_one_size(size, recs):
    # one size (the uniform path when every delta is below 64), offsets past 63 (two-byte varints)
    _check([bytes([b]) * size for b, _ in recs], [d for _, d in recs])


def test_offset_deltas_past_the_varint_cache():
    _check([b"x"] * 20000, [0] * 20000)


def test_one_size_in_batches_of_different_lengths():
    # the per-size parts are cached for the longest batch seen: shorter and longer ones after it
    for n in (3, 300, 2, 1000, 1):
        _check([b"%05d" % i for i in range(n)], [i % 64 for i in range(n)])
