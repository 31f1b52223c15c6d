"""A segment file read as it is on disk, for `oncelog log dump` (Kafka's kafka-dump-log): each
batch's header (offsets, producer id, epoch and sequences, transactional and control flags, the
marker of a control batch), and with `verify` what a stopped broker's segment must satisfy:

- every entry frames: the file is batches back to back up to its end (a torn or overwritten tail
  is reported with its position and size);
- every batch matches its CRC (CRC-32C for v2 batches, CRC-32 for v0/v1 messages);
- offsets only grow: each batch starts after the previous one ended, and not below the base
  offset the file is named after;
- the sparse `.index` beside it (when present) points at batch starts holding its offsets.

Nothing here writes; a broker may keep running on other partitions while one is read."""
from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crc32c import crc32c

from oncelog.protocol import records as rec
from oncelog.protocol.compression import CODEC_NAMES
from oncelog.protocol.errors import KafkaProtocolError

_CODECS = {v: k for k, v in CODEC_NAMES.items()}
_INDEX_ENTRY = struct.Struct(">ii")
_LEGACY_CRC_FROM = 16   # offset (8) + size (4) + crc (4): a v0/v1 CRC covers what follows


class NotASegment(ValueError):
    """The file does not hold record batches where a segment would."""


@dataclass(frozen=True)
class BatchInfo:
    position: int
    base_offset: int
    last_offset: int
    count: int
    size: int
    magic: int
    crc: int
    crc_valid: bool
    compression: str
    timestamp_type: str
    base_timestamp: int
    max_timestamp: int
    partition_leader_epoch: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    last_sequence: int
    transactional: bool
    control: bool
    marker: str | None               # "COMMIT" or "ABORT" for a transaction marker
    coordinator_epoch: int | None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Problem:
    position: int
    message: str


def base_offset_of(path: Path) -> int | None:
    """The base offset a segment's name gives (20 digits), or None."""
    stem = path.name.split(".", 1)[0]
    return int(stem) if stem.isdigit() else None


def _crc_valid(data: memoryview, pos: int, h: rec.BatchHeader) -> bool:
    if h.magic == 2:
        return crc32c(data[pos + rec.CRC_START:pos + h.size]) == h.crc
    return zlib.crc32(data[pos + _LEGACY_CRC_FROM:pos + h.size]) == h.crc


def _marker(data: memoryview, pos: int, h: rec.BatchHeader) -> tuple[str | None, int | None]:
    if not h.is_control or h.magic != 2:
        return None, None
    try:
        m = rec.marker_of_batch(data[pos:pos + h.size])
    except KafkaProtocolError:
        return None, None
    return ("COMMIT" if m.commit else "ABORT"), m.coordinator_epoch


def _info(data: memoryview, pos: int, h: rec.BatchHeader) -> BatchInfo:
    valid = _crc_valid(data, pos, h)
    marker, coordinator_epoch = _marker(data, pos, h) if valid else (None, None)
    last_seq = -1 if h.base_sequence < 0 else (h.base_sequence + h.last_offset_delta) % 2**31
    return BatchInfo(
        pos, h.base_offset, h.last_offset, h.records_count, h.size, h.magic, h.crc, valid,
        _CODECS.get(h.compression, str(h.compression)), "LogAppendTime" if h.timestamp_type else "CreateTime",
        h.base_timestamp, h.max_timestamp, h.partition_leader_epoch, h.producer_id, h.producer_epoch,
        h.base_sequence, last_seq, h.is_transactional, h.is_control, marker, coordinator_epoch)


def read_segment(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except IsADirectoryError:
        raise NotASegment(f"{path} is a directory: name its .log files") from None
    except OSError as e:
        raise NotASegment(f"cannot read {path}: {e.strerror or e}") from None


def batches(data: bytes) -> Iterator[BatchInfo]:
    """Each entry that frames, in file order; the walk ends where framing does (`verify` says
    why and where)."""
    view = memoryview(data)
    for pos, header in rec.iter_batches(view):
        yield _info(view, pos, header)


def check_is_segment(path: Path, data: bytes) -> None:
    """NotASegment unless the file starts with a batch (an empty file is an empty segment)."""
    if not data:
        return
    first = next(iter(rec.iter_batches(memoryview(data))), None)
    if first is None:
        raise NotASegment(f"{path} is not a log segment: no record batch at position 0")


def verify(path: Path, data: bytes, infos: list[BatchInfo]) -> list[Problem]:
    """What is wrong with a segment whose batches (`batches(data)`) are `infos`."""
    problems = []
    expected_base = base_offset_of(path)
    previous_last = None
    for b in infos:
        if not b.crc_valid:
            problems.append(Problem(b.position, f"batch at offset {b.base_offset}: CRC mismatch "
                                                f"(stored {b.crc:#010x})"))
        if expected_base is not None and b.base_offset < expected_base:
            problems.append(Problem(b.position, f"batch at offset {b.base_offset} is below the segment's base "
                                                f"offset {expected_base}"))
        if previous_last is not None and b.base_offset <= previous_last:
            problems.append(Problem(b.position, f"batch at offset {b.base_offset} does not follow the previous "
                                                f"batch's last offset {previous_last}"))
        if b.last_offset < b.base_offset:
            problems.append(Problem(b.position, f"batch at offset {b.base_offset} ends before it starts "
                                                f"(last offset {b.last_offset})"))
        previous_last = b.last_offset
    end = infos[-1].position + infos[-1].size if infos else 0
    if end < len(data):
        problems.append(Problem(end, f"{len(data) - end} bytes at the end do not frame a batch "
                                     "(a torn write, or overwritten bytes)"))
    problems += _verify_index(path, infos)
    return problems


def _verify_index(path: Path, infos: list[BatchInfo]) -> list[Problem]:
    index = path.with_suffix(".index")
    base = base_offset_of(path)
    if base is None or not index.exists():
        return []
    raw = index.read_bytes()
    by_position = {b.position: b for b in infos}
    problems = []
    for i in range(len(raw) // _INDEX_ENTRY.size):
        relative, position = _INDEX_ENTRY.unpack_from(raw, i * _INDEX_ENTRY.size)
        b = by_position.get(position)
        if b is None or not b.base_offset <= base + relative <= b.last_offset:
            problems.append(Problem(position, f"{index.name} entry {i} (offset {base + relative}, position "
                                              f"{position}) does not point at the batch holding that offset"))
    return problems
