"""What a replayed streaming write task decides with (spark/replay.py), without Spark: the
fingerprint of its input, and the spill it writes from when the fingerprint differs."""
import os
import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.tiers import examples

from oncelog.spark.replay import Fingerprint, Spill, fingerprinted, hash_binary

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                    ("partition", pa.int32()), ("headers", HEADERS)])

blobs = st.one_of(st.none(), st.binary(max_size=40))
rows_st = st.lists(st.tuples(
    blobs, blobs, st.sampled_from(["a", "b"]), st.one_of(st.none(), st.integers(0, 3)),
    st.one_of(st.none(), st.lists(st.tuples(st.sampled_from(["h", "i"]), blobs), max_size=3))),
    min_size=1, max_size=60)


def _batches(rows, cuts):
    table = pa.table({
        "key": pa.array([r[0] for r in rows], pa.binary()),
        "value": pa.array([r[1] for r in rows], pa.binary()),
        "topic": pa.array([r[2] for r in rows], pa.string()),
        "partition": pa.array([r[3] for r in rows], pa.int32()),
        "headers": pa.array([None if r[4] is None else [{"key": k, "value": v} for k, v in r[4]]
                             for r in rows], HEADERS)}, schema=SCHEMA)
    edges = sorted({0, len(rows), *(c for c in cuts if c < len(rows))})
    return [table.slice(a, b - a).to_batches()[0] for a, b in zip(edges, edges[1:]) if b > a]


def _digest(batches, topic_option=None, include_headers=True):
    fp = Fingerprint(topic_option, include_headers)
    for b in batches:
        fp.update(b)
    return fp.digest()


@settings(max_examples=examples(150), deadline=None)
@given(rows_st, st.randoms(use_true_random=False), st.lists(st.integers(0, 60), max_size=4))
def test_fingerprint_ignores_order_and_batch_cuts(rows, rnd, cuts):
    shuffled = list(rows)
    rnd.shuffle(shuffled)
    assert _digest(_batches(rows, [])) == _digest(_batches(shuffled, cuts))


@settings(max_examples=examples(150), deadline=None)
@given(rows_st, st.data())
def test_fingerprint_sees_any_change_of_a_written_field(rows, data):
    i = data.draw(st.integers(0, len(rows) - 1))
    field = data.draw(st.integers(0, 4))
    row = list(rows[i])
    row[field] = data.draw(
        [blobs, blobs, st.sampled_from(["a", "b"]), st.one_of(st.none(), st.integers(0, 3)),
         st.one_of(st.none(), st.lists(st.tuples(st.sampled_from(["h", "i"]), blobs),
                                       max_size=3))][field].filter(lambda v: v != row[field]))
    changed = rows[:i] + [tuple(row)] + rows[i + 1:]
    assert _digest(_batches(rows, [])) != _digest(_batches(changed, []))
    # one row more (a repeat) or less is another input too
    assert _digest(_batches(rows, [])) != _digest(_batches(rows + rows[:1], []))


def test_fingerprint_tells_null_from_empty_and_keeps_word_boundaries():
    h = hash_binary(pa.array([None, b"", b"\0", b"\0" * 8, b"ab", b"ab\0", b"x" * 8 + b"y",
                              b"y" + b"x" * 8], pa.binary()))
    assert len(set(h.tolist())) == 8
    # a value hashes the same wherever it sits in the column's buffer
    assert hash_binary(pa.array([b"abc", b"ab"]))[1] == hash_binary(pa.array([b"ab"]))[0]
    # swapping two 8-byte words of a value changes its hash
    a, b = b"A" * 8, b"B" * 8
    assert len(set(hash_binary(pa.array([a + b + b + a, b + a + a + b])).tolist())) == 2


def test_topic_option_and_headers_count_only_as_the_writer_uses_them():
    batches = _batches([(None, b"v", "a", None, [("h", b"1")])], [])
    other = _batches([(None, b"v", "b", None, [("h", b"2")])], [])
    # the topic option wins over the column; headers count only with includeHeaders
    assert _digest(batches, "t", False) == _digest(other, "t", False)
    assert _digest(batches, "t", True) != _digest(other, "t", True)
    assert _digest(batches, None, False) != _digest(other, None, False)


def test_spill_gives_back_the_batches_and_removes_its_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path},/nonexistent")
    rnd = random.Random(5)
    rows = [(None, rnd.randbytes(rnd.randint(0, 3000)), "a", None, None) for _ in range(500)]
    batches = _batches(rows, [100, 250, 251])
    fp = Fingerprint(None, False)
    with Spill() as spill:
        assert os.path.dirname(spill.path) == str(tmp_path)
        spill.write(fingerprinted(iter(batches), fp))
        back = list(spill.read())
        assert [b.to_pydict() for b in back] == [b.to_pydict() for b in batches]
        assert _digest(back, None, False) == fp.digest() == _digest(batches, None, False)
    assert os.listdir(tmp_path) == []
    with Spill() as empty:              # a task without input
        empty.write(iter([]))
        assert list(empty.read()) == []
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("size", [100, 2000])
def test_fingerprint_is_cheap_enough_to_compute_on_every_streaming_task(size):
    """Not a timing assertion: a smoke check that big batches take the vectorised paths
    (fixed-size values as a matrix, mixed sizes as runs) and agree with each other."""
    fixed = pa.array([b"x" * size] * 5000, pa.binary())
    mixed = pa.array([b"x" * size] * 4999 + [b"x" * (size + 3)], pa.binary())
    assert (hash_binary(fixed)[:4999] == hash_binary(mixed)[:4999]).all()
