"""What a replayed streaming write task needs to decide whether it may skip: a fingerprint of
its input, and a local spill of that input while the fingerprint is computed.

A marker confirmed by the driver says "task i of batch b held an input with this fingerprint,
and Spark counted its attempt successful". A replay of batch b may split the batch differently
(another `minPartitions`, a changed plan), so task i of the replay may hold other rows: it skips
only if its own input has the same fingerprint (same rows, in any order); otherwise it writes
them. It knows its fingerprint only once its input ended, so a task that has a marker to compare
with keeps its input in a local Arrow IPC file meanwhile (memory stays bounded) and writes from
that file if the fingerprints differ. Only such tasks pay for the file; replays are rare."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from oncelog.spark.arrow_records import binary_column

_U64 = np.uint64
# odd constants that tell the fields of a record apart (and positions within a value)
_POSITION = _U64(0x9E3779B97F4A7C15)
_FIELD = [_U64(c) for c in (0xA0761D6478BD642F, 0xE7037ED1A0B428DB, 0x8EBC6AF09C88C6E3,
                            0x589965CC75374CC3, 0x1D8E4E27C47D124F, 0xD6E8FEB86659FD93)]
_NULL = -1
_MASK = (1 << 64) - 1
_PADS = pa.array([b"\0" * i for i in range(8)], pa.binary())


class _Scratch:
    """Word arrays reused from one batch to the next: a fresh array of a megabyte costs its
    page faults again every time, as much as the arithmetic done in it."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def get(self, name: str, size: int) -> np.ndarray:
        buf = self._buffers.get(name)
        if buf is None or len(buf) < size:
            buf = self._buffers[name] = np.empty(max(size, 1 << 16), dtype=_U64)
        return buf[:size]


def _mix(z: np.ndarray, tmp: np.ndarray | None = None) -> np.ndarray:
    """murmur3's 64-bit finaliser, in place: every input bit moves every output bit."""
    tmp = np.empty_like(z) if tmp is None else tmp
    for c in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, None):
        np.right_shift(z, _U64(33), out=tmp)
        z ^= tmp
        if c is not None:
            z *= _U64(c)
    return z


def _hash_lengths(lengths: np.ndarray) -> np.ndarray:
    return _mix(lengths.astype(np.int64).view(_U64) ^ _FIELD[5])


def _positions(starts: np.ndarray, counts: np.ndarray, out: np.ndarray) -> np.ndarray:
    """For each item laid out in runs (starts, counts) over `out`, its place in its run."""
    filled = counts > 0
    s, c = starts[filled], counts[filled]
    out.fill(1)
    out[s[0]] = 0
    out[s[1:]] = (1 - c[:-1]).view(_U64)       # back to 0 where a run begins
    return np.cumsum(out, out=out)


def _run_sums(z: np.ndarray, starts: np.ndarray, counts: np.ndarray,
              prefix: np.ndarray) -> np.ndarray:
    """Sum (mod 2**64) of each run (starts, counts) of z; prefix has room for len(z) + 1."""
    prefix[0] = 0
    np.cumsum(z, out=prefix[1:])
    return prefix[starts + counts] - prefix[starts]


def hash_binary(col: pa.Array, scratch: _Scratch | None = None) -> np.ndarray:
    """A 64-bit hash of each value of a binary or string column (null differs from empty),
    vectorised over the column's bytes: each value is padded to whole 8-byte words (so that
    every value starts on a word, whatever comes before it), each word is mixed with its
    position in the value, and a value's hash is the mixed sum of its words and its length."""
    scratch = scratch or _Scratch()
    col = binary_column(col)
    n = len(col)
    lengths = pc.fill_null(pc.binary_length(col), _NULL).to_numpy(zero_copy_only=False)
    pad = (-np.maximum(lengths, 0)) % 8
    padded = pc.binary_join_element_wise(col, _PADS.take(pa.array(pad)), pa.scalar(b"", pa.binary()),
                                         null_handling="replace", null_replacement=b"")
    offsets = np.frombuffer(padded.buffers()[1], dtype=np.int32, count=n + 1,
                            offset=padded.offset * 4).astype(np.int64)
    total = int(offsets[-1] - offsets[0]) // 8
    if not total:
        return _mix(_hash_lengths(lengths))     # as below, with every sum 0
    words = np.frombuffer(padded.buffers()[2], dtype="<u8", count=total, offset=int(offsets[0]))
    counts = np.diff(offsets) // 8
    width = int(counts[0])
    z = scratch.get("z", total)
    tmp = scratch.get("tmp", total)
    if (counts == width).all():     # values of one padded size: a matrix, no runs to find
        z = z.reshape(n, width)
        np.bitwise_xor(words.reshape(n, width), np.arange(width, dtype=_U64) * _POSITION, out=z)
        sums = _mix(z, tmp.reshape(n, width)).sum(axis=1, dtype=_U64)
    else:
        starts = (offsets[:-1] - offsets[0]) // 8
        _positions(starts, counts, z)
        z *= _POSITION
        z ^= words
        sums = _run_sums(_mix(z, tmp), starts, counts, scratch.get("prefix", total + 1))
    sums ^= _hash_lengths(lengths)
    return _mix(sums)


def _hash_ints(col: pa.Array) -> np.ndarray:
    values = pc.fill_null(col.cast(pa.int64()), _NULL).to_numpy(zero_copy_only=False)
    return _mix(values.astype(np.int64).view(_U64) ^ _FIELD[4])


def _hash_headers(col: pa.Array, scratch: _Scratch) -> np.ndarray:
    """Kafka headers (list<struct<key, value>>): each header's key and value, with its place in
    the list; a row's hash sums its headers' and mixes in their count (null list: -1)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(col), _NULL).to_numpy(zero_copy_only=False)
    counts = np.maximum(lengths, 0).astype(np.int64)
    items = col.flatten()                       # the headers of non-null rows, in row order
    if not len(items):
        return _mix(_hash_lengths(lengths))     # as below, with every sum 0
    key, value = items.flatten()
    starts = np.zeros(len(col), dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    z = _positions(starts, counts, np.empty(len(items), dtype=_U64))
    z *= _POSITION
    z += _mix(hash_binary(key, scratch) ^ _FIELD[0]) + hash_binary(value, scratch)
    sums = _run_sums(_mix(z), starts, counts, np.empty(len(items) + 1, dtype=_U64))
    return _mix(sums ^ _hash_lengths(lengths))


def _column(batch, name: str):
    i = batch.schema.get_field_index(name)
    return None if i < 0 else batch.column(i)


class Fingerprint:
    """Row count and an order-independent digest of what a write task produces from its input:
    per row, a 64-bit hash of value, key, topic (the `topic` option when set, as the writer
    uses it), partition and, with includeHeaders, headers; summed over rows in two lanes
    (mod 2**64). Equal multisets of rows give equal fingerprints however the rows are ordered or
    cut into Arrow batches; computed column-wise, no Python work per row."""

    def __init__(self, topic_option: str | None, include_headers: bool) -> None:
        self.include_headers = include_headers
        self.rows = 0
        self._lanes = [0, 0]
        self._scratch = _Scratch()
        self._topic = None if not topic_option else \
            hash_binary(pa.array([topic_option.encode()], pa.binary()))

    def update(self, batch) -> None:
        n = batch.num_rows
        if not n:
            return
        scratch = self._scratch
        h = hash_binary(_column(batch, "value"), scratch)
        key = _column(batch, "key")
        fields = [None if key is None else hash_binary(key, scratch)]
        topic = _column(batch, "topic")
        fields.append(self._topic if self._topic is not None else
                      None if topic is None else hash_binary(topic, scratch))
        part = _column(batch, "partition")
        fields.append(None if part is None else _hash_ints(part))
        headers = _column(batch, "headers") if self.include_headers else None
        fields.append(None if headers is None else _hash_headers(headers, scratch))
        for i, f in enumerate(fields):
            # an absent column hashes as a column of nulls (the writer treats both alike)
            h = _mix(h ^ _FIELD[i]) + (_NULL_HASH if f is None else f)
        h = _mix(h)
        self._lanes[0] = (self._lanes[0] + int(h.sum(dtype=_U64))) & _MASK
        self._lanes[1] = (self._lanes[1] + int(_mix(h ^ _FIELD[5]).sum(dtype=_U64))) & _MASK
        self.rows += n

    def digest(self) -> str:
        return f"{self.rows}-{self._lanes[0]:016x}{self._lanes[1]:016x}"


_NULL_HASH = hash_binary(pa.array([None], pa.binary()))[0]


def fingerprinted(batches: Iterable, fp: Fingerprint) -> Iterator:
    """The batches, each added to `fp` on its way through."""
    for batch in batches:
        fp.update(batch)
        yield batch


class Spill:
    """A task's input in a temporary Arrow IPC file in Spark's local directory (as Spark's
    own spills), read back memory-mapped; removed on close."""

    def __init__(self) -> None:
        local = (os.environ.get("SPARK_LOCAL_DIRS") or "").split(",")[0] or None
        fd, self.path = tempfile.mkstemp(prefix="oncelog-replay-", suffix=".arrow", dir=local)
        os.close(fd)
        self._source = None
        self.batches_written = 0

    def write(self, batches: Iterable) -> None:
        writer = None
        try:
            for batch in batches:
                if writer is None:
                    writer = pa.ipc.new_file(self.path, batch.schema)
                writer.write_batch(batch)
                self.batches_written += 1
        finally:
            if writer is not None:
                writer.close()

    def read(self) -> Iterator:
        if not self.batches_written:
            return
        self._source = pa.memory_map(self.path)
        reader = pa.ipc.open_file(self._source)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> Spill:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
