"""Record batches: the one codec for the broker, the client and the Spark connector.

- batch.py: the v2 format, `BatchHeader` (one header type for every format), `iter_batches` (the
  one walk over a buffer of batches, whatever it holds), CRC checks and in-place header rewrites;
- varint.py: zig-zag varints;
- encode.py: records into batches, with the producer's fast paths;
- decode.py: batches into records;
- validate.py: the broker's header-level checks of produced batches;
- legacy.py: v0/v1 message sets.
Import from the package; the modules are its layout, not its interface.
"""
from oncelog.protocol.records.batch import (
    ATTR_COMPRESSION_MASK,
    ATTR_CONTROL,
    ATTR_TIMESTAMP_TYPE,
    ATTR_TRANSACTIONAL,
    BATCH_HEADER,
    BATCH_OVERHEAD,
    CRC_START,
    FRAME_PREFIX,
    LOG_OVERHEAD,
    NO_PRODUCER_ID,
    BatchHeader,
    Frame,
    Header,
    Record,
    check_crc,
    entry_frame,
    iter_batches,
    magic_of,
    patch_batch,
    read_batch_header,
    rewrite_producer_state,
    set_max_timestamp,
    writable,
)
from oncelog.protocol.records.control import (
    CONTROL_ATTRIBUTES,
    EndTxnMarker,
    decode_marker,
    encode_marker_batch,
    is_abort_marker_batch,
    marker_of_batch,
)
from oncelog.protocol.records.decode import decode_batch, decode_records, iter_record_batches, iter_record_times
from oncelog.protocol.records.encode import (
    HEADER_ROOM,
    RECORD_OVERHEAD,
    build_batch,
    encode_batch,
    encode_plain_records,
    encode_record,
    recompress,
    record_size_upper_bound,
    seal_batch,
)
from oncelog.protocol.records.legacy import (
    LegacySetInfo,
    encode_legacy_message,
    message_format_magic,
    parse_message_format_version,
    patch_legacy_offsets,
    upconvert_legacy_message_set,
    validate_legacy_message_set,
)
from oncelog.protocol.records.validate import check_batch, validate_batch, validate_record_set
from oncelog.protocol.records.varint import decode_varint, encode_varint

__all__ = [
    "ATTR_COMPRESSION_MASK", "ATTR_CONTROL", "ATTR_TIMESTAMP_TYPE", "ATTR_TRANSACTIONAL", "BATCH_HEADER",
    "BATCH_OVERHEAD", "CONTROL_ATTRIBUTES", "CRC_START", "EndTxnMarker", "decode_marker",
    "encode_marker_batch", "is_abort_marker_batch", "marker_of_batch", "HEADER_ROOM", "LOG_OVERHEAD",
    "NO_PRODUCER_ID", "RECORD_OVERHEAD", "FRAME_PREFIX", "Frame", "entry_frame",
    "BatchHeader", "Header", "LegacySetInfo", "Record", "build_batch", "check_batch", "check_crc",
    "decode_batch", "decode_records", "decode_varint", "encode_batch", "encode_legacy_message",
    "encode_plain_records", "encode_record", "encode_varint", "iter_batches", "iter_record_batches",
    "iter_record_times", "magic_of", "message_format_magic", "parse_message_format_version",
    "patch_batch", "patch_legacy_offsets", "read_batch_header",
    "recompress", "record_size_upper_bound", "rewrite_producer_state", "seal_batch", "set_max_timestamp",
    "upconvert_legacy_message_set",
    "validate_batch", "validate_legacy_message_set", "validate_record_set", "writable",
]
