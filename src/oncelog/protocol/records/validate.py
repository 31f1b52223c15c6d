"""What the broker checks of a produced v2 record set, at header level.

The broker never decodes individual records on the produce path: a batch is validated by its
61-byte header and one CRC-32C over attributes..end; the broker then patches the two fields the
CRC does not cover (base offset, partition leader epoch) and writes the bytes as they came.
"""
from __future__ import annotations

from oncelog.protocol.primitives import Buf
from oncelog.protocol.records.batch import (
    BATCH_OVERHEAD,
    LOG_OVERHEAD,
    BatchHeader,
    check_crc,
    corrupt,
    invalid,
    iter_batches,
    read_batch_header,
)

_MIN_BATCH_LENGTH = BATCH_OVERHEAD - LOG_OVERHEAD
_MIN_RECORD_SIZE = 7  # length, attributes, two deltas, key, value, headers: one byte each at least


def check_batch(buf: Buf, pos: int, header: BatchHeader) -> None:
    """Check one v2 batch whose header was read at `pos`: length, magic, counts, then the CRC."""
    if header.magic != 2:
        raise corrupt(f"record batch magic {header.magic}, expected 2")
    if header.batch_length < _MIN_BATCH_LENGTH:
        raise corrupt(f"record batch length {header.batch_length} is below the header size")
    if pos + header.size > len(buf):
        raise corrupt("record batch extends past the end of the record set")
    if header.records_count <= 0:
        raise invalid(f"record batch holds {header.records_count} records")
    if header.last_offset_delta != header.records_count - 1:
        raise invalid(f"record batch count {header.records_count} disagrees with last offset "
                      f"delta {header.last_offset_delta}")
    if header.compression == 0 and \
            header.batch_length - _MIN_BATCH_LENGTH < header.records_count * _MIN_RECORD_SIZE:
        raise invalid(f"record batch of {header.batch_length} bytes cannot hold "
                      f"{header.records_count} records")
    check_crc(buf, pos, header)


def validate_batch(buf: Buf, pos: int = 0) -> BatchHeader:
    """Validate the single v2 batch at `pos` and return its header."""
    header = read_batch_header(buf, pos)
    check_batch(buf, pos, header)
    return header


def validate_record_set(buf: Buf) -> list[BatchHeader]:
    """Validate a produced v2 record set (one or more batches covering the buffer exactly)."""
    if len(buf) == 0:
        raise invalid("empty record set")
    headers: list[BatchHeader] = []
    for pos, header in iter_batches(buf, exact=True):
        check_batch(buf, pos, header)
        headers.append(header)
    return headers
