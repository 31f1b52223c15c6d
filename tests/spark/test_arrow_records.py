"""The connector's columnar codec against the row codec (protocol/records) and Kafka's
partitioner: whatever the rows, the batches it writes decode to the same rows, and what it
reads equals what the row decoder reads. No Spark session needed."""
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.tiers import examples

from oncelog.client.partitioner import murmur2
from oncelog.protocol.errors import KafkaProtocolError
from oncelog.protocol.records import build_batch, encode_batch, iter_record_batches
from oncelog.spark import arrow_records as ar
from oncelog.spark.arrow_io import arrow_schema

blobs = st.one_of(st.none(), st.binary(max_size=40), st.binary(min_size=100, max_size=20000))
rows = st.lists(st.tuples(blobs, blobs, st.integers(0, 3)), min_size=1, max_size=300)


def _decode(data, lo=0, hi=2**62, headers=False):
    cols = ar.Columns()
    ar.decode_into(cols, data, lo, hi, True, headers)
    if not cols.rows:
        return None
    return ar.to_record_batch(cols, "t", 0, arrow_schema(headers))


@settings(max_examples=examples(60), deadline=None)
@given(rows, st.sampled_from([300, 5000, 1 << 20]), st.booleans())
def test_encoded_batches_decode_to_the_rows_of_each_partition(data, limit, with_keys):
    keys = pa.array([k for k, _v, _p in data], pa.binary()) if with_keys else None
    values = pa.array([v for _k, v, _p in data], pa.binary())
    parts = np.array([p for _k, _v, p in data])
    got: dict[int, list] = {}
    for p, count, records in ar.encode_partitioned(keys, values, parts, limit):
        assert count == 1 or len(records) <= limit
        (_info, recs), = iter_record_batches(build_batch(bytes(records), count))
        got.setdefault(p, []).extend((r.key, r.value) for r in recs)
    for p in range(4):
        want = [(k if with_keys else None, v) for k, v, q in data if q == p]
        assert got.get(p, []) == want


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(blobs, blobs, st.integers(0, 10**6)), min_size=1, max_size=300),
       st.integers(0, 2), st.booleans())
def test_columnar_decoding_equals_row_decoding(data, codec, uniform):
    if uniform:   # equal-size records take the vectorised run path
        data = [(b"k%03d" % (i % 1000), b"v" * 50, ts) for i, (_k, _v, ts) in enumerate(data)]
    recs = [(i, ts, k, v) for i, (k, v, ts) in enumerate(data)]
    batch = encode_batch(recs, base_offset=1000, compression=codec)
    buf = batch + batch[:20]          # a truncated batch behind it, as in a Fetch response
    rb = _decode(buf)
    (_info, want), = iter_record_batches(batch)
    assert rb.column("key").to_pylist() == [r.key for r in want]
    assert rb.column("value").to_pylist() == [r.value for r in want]
    assert rb.column("offset").to_pylist() == [r.offset for r in want]
    ts = rb.column("timestamp").cast(pa.int64()).to_pylist()
    assert ts == [r.timestamp * 1000 for r in want]
    mid = 1000 + len(data) // 2
    part = _decode(buf, lo=mid, hi=mid + 3)
    assert part.column("offset").to_pylist() == list(range(mid, min(mid + 3, 1000 + len(data))))


def test_headers_are_read_when_asked():
    recs = [(i, 5, b"k", b"v%d" % i, [("h", b"x%d" % i)] if i % 2 else []) for i in range(6)]
    rb = _decode(encode_batch(recs), headers=True)
    assert rb.column("headers").to_pylist()[1] == [{"key": "h", "value": b"x1"}]
    assert rb.column("headers").to_pylist()[0] == []
    assert rb.column("value").to_pylist() == [b"v%d" % i for i in range(6)]


@pytest.mark.parametrize("flip", [70, 80, 200])
def test_a_corrupt_batch_is_refused_not_misread(flip):
    batch = bytearray(encode_batch([(i, 0, None, b"x" * 30) for i in range(20)]))
    batch[flip] ^= 0xFF
    with pytest.raises(KafkaProtocolError):
        _decode(bytes(batch))


def test_wrong_record_lengths_are_refused_even_without_crc():
    recs = [(i, 0, None, b"x" * 30) for i in range(20)]
    batch = bytearray(encode_batch(recs))
    batch[61] += 2      # the first record claims a longer body
    cols = ar.Columns()
    with pytest.raises(KafkaProtocolError):
        ar.decode_into(cols, bytes(batch), 0, 100, False, False)


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.binary(max_size=30), min_size=1, max_size=200), st.integers(1, 50))
def test_vectorised_murmur2_matches_kafkas_partitioner(keys, n):
    got = ar.murmur2_partitions(pa.array(keys, pa.binary()), n)
    assert list(got) == [(murmur2(k) & 0x7FFFFFFF) % n for k in keys]
