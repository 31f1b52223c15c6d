"""The producer's batch encoder for keyless, headerless records equals the record-by-record one."""
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.protocol.record_codec import encode_plain_records, encode_record


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=300), st.binary(min_size=16400, max_size=17000)),
                          st.integers(-2**40, 2**40) | st.integers(0, 20000)), max_size=60))
def test_plain_records_equal_record_by_record_encoding(recs):
    values = [v for v, _ in recs]
    deltas = [d for _, d in recs]
    want = b"".join(encode_record(i, d, None, v) for i, (v, d) in enumerate(recs))
    assert encode_plain_records(values, deltas) == want


def test_offset_deltas_past_the_varint_cache():
    values = [b"x"] * 20000
    want = b"".join(encode_record(i, 0, None, b"x") for i in range(20000))
    assert encode_plain_records(values, [0] * 20000) == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=300) | st.binary(min_size=16250, max_size=16400),
                          st.integers(0, 16383)), min_size=1, max_size=60))
def test_vectorised_path_equals_record_by_record_encoding(recs):
    # values present, deltas and lengths within the varint cache: the C-level path
    values = [v for v, _ in recs]
    deltas = [d for _, d in recs]
    want = b"".join(encode_record(i, d, None, v) for i, (v, d) in enumerate(recs))
    assert encode_plain_records(values, deltas) == want
