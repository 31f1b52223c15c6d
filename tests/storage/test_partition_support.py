"""A minimal file-backed stand-in for `oncelog.storage.log.PartitionLog`, used by the partition
tests only while STORAGE's real log has not landed (they switch to the real one by themselves).

It keeps the contract's behaviour that producer state depends on: offsets assigned by patching
base offsets, data in a real file that survives close/reopen, a torn tail cut at open, segment
rolls by size reported through `on_roll`, log start moves reported through `on_segments_deleted`,
`iter_batches_from`, `batch_headers_between`, `batch_header_at`, `delete_records_before` and
`truncate_to`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from oncelog.protocol import records as rec
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError


class AppendInfo(NamedTuple):
    first_offset: int
    last_offset: int
    log_append_time: int


@dataclass
class LogConfig:
    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 86_400_000
    retention_ms: int = 7 * 86_400_000
    retention_bytes: int = -1
    flush_messages: int = 1 << 62
    flush_ms: int = 1 << 62
    index_interval_bytes: int = 4096
    message_format_version: str = "3.0"


class PartitionLog:
    def __init__(self, directory: Path, config: LogConfig) -> None:
        self.directory = Path(directory)
        self.config = config
        self._roll_callbacks = []
        self._delete_callbacks = []
        self._index: list[tuple[int, int, int]] = []  # (base offset, position, size)
        self._segment_bytes = 0
        self.log_start_offset = 0

    @classmethod
    def open(cls, directory, config, now_ms) -> "PartitionLog":
        self = cls(directory, config)
        self.directory.mkdir(parents=True, exist_ok=True)
        meta = self.directory / "meta.json"
        if meta.exists():
            self.log_start_offset = json.loads(meta.read_text())["log_start_offset"]
        data = self._path.read_bytes() if self._path.exists() else b""
        pos = 0
        for pos_, h in rec.iter_batches(data):
            self._index.append((h.base_offset, pos_, h.size))
            pos = pos_ + h.size
        if pos < len(data):  # a torn write: cut it, as recovery does
            with open(self._path, "r+b") as f:
                f.truncate(pos)
        self._file = open(self._path, "ab")
        return self

    @property
    def _path(self) -> Path:
        return self.directory / "data.log"

    @property
    def log_end_offset(self) -> int:
        if not self._index:
            return self.log_start_offset
        base, pos, _size = self._index[-1]
        return max(self.log_start_offset, base + self._count_at(pos))

    @property
    def high_watermark(self) -> int:
        return self.log_end_offset   # the stand-in writes through: everything is "durable"

    def _count_at(self, pos: int) -> int:
        with open(self._path, "rb") as f:
            f.seek(pos)
            return rec.read_batch_header(f.read(rec.BATCH_OVERHEAD)).records_count

    def on_roll(self, callback) -> None:
        self._roll_callbacks.append(callback)

    def on_segments_deleted(self, callback) -> None:
        self._delete_callbacks.append(callback)

    def append(self, batches, now_ms: int) -> AppendInfo:
        buf = bytearray(batches)
        if self._segment_bytes and self._segment_bytes + len(buf) > self.config.segment_bytes:
            self._segment_bytes = 0
            for cb in self._roll_callbacks:
                cb(self.log_end_offset)
        first = offset = self.log_end_offset
        position = self._file.tell()
        for pos, h in list(rec.iter_batches(buf)):
            rec.patch_batch(buf, pos, offset, 0)
            self._index.append((offset, position + pos, h.size))
            offset += h.records_count
        self._file.write(buf)
        self._file.flush()
        self._segment_bytes += len(buf)
        return AppendInfo(first, offset - 1, -1)

    def _batches_from(self, offset: int):
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise KafkaProtocolError(ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {offset}")
        self._file.flush()
        with open(self._path, "rb") as f:
            data = f.read()
        for i, (base, pos, size) in enumerate(self._index):
            nxt = self._index[i + 1][0] if i + 1 < len(self._index) else self.log_end_offset
            if nxt > offset:
                yield data[pos:pos + size]

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None,
             min_one: bool = True) -> bytes:
        out = b""
        for b in self._batches_from(offset):
            if max_offset is not None and rec.read_batch_header(b).base_offset >= max_offset:
                break
            if (out or not min_one) and len(out) + len(b) > max_bytes:
                break
            out += b
        return out

    def iter_batches_from(self, offset: int):
        for b in self._batches_from(offset):
            yield rec.read_batch_header(b)

    def batch_headers_between(self, start: int, end: int):
        start = max(start, self.log_start_offset)
        if start >= min(end, self.log_end_offset):
            return
        for h in self.iter_batches_from(start):
            if h.base_offset >= end:
                return
            yield h

    def batch_header_at(self, offset: int):
        for base, pos, _size in self._index:
            if base == offset:
                self._file.flush()
                with open(self._path, "rb") as f:
                    f.seek(pos)
                    h = rec.read_batch_header(f.read(rec.BATCH_OVERHEAD))
                return h if h.last_offset >= self.log_start_offset else None
        return None

    def delete_records_before(self, offset: int) -> None:
        if offset > self.log_end_offset:
            raise KafkaProtocolError(ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {offset}")
        self.log_start_offset = max(self.log_start_offset, offset)
        (self.directory / "meta.json").write_text(json.dumps({"log_start_offset": self.log_start_offset}))
        for cb in self._delete_callbacks:
            cb(self.log_start_offset)

    def truncate_to(self, offset: int) -> None:
        keep = [e for e in self._index if e[0] < offset]
        cut = keep[-1][1] + keep[-1][2] if keep else 0
        self._file.close()
        with open(self._path, "r+b") as f:
            f.truncate(cut)
        self._index = keep
        self._file = open(self._path, "ab")

    def flush(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()
