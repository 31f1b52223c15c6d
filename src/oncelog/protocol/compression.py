"""Record-batch compression codecs (the codec number is the batch's attributes & 0x07).

gzip=1, snappy=2, lz4=3 (LZ4 frame, as Kafka >= 0.10 writes), zstd=4, all through cramjam.
Snappy is written raw (what librdkafka writes and the Java reader accepts); on read the xerial
framing that the Java client writes (`SnappyOutputStream`) is recognised and unframed.
"""
from __future__ import annotations

import struct

import cramjam

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {"none": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_LEN = 16  # magic (8) + version (4) + compatible version (4)


def codec_for_name(name: str | int) -> int:
    """Map a `compression.type` value to its codec number, with a clear error for typos."""
    if isinstance(name, int):
        if name in CODEC_NAMES.values():
            return name
        raise ValueError(f"unknown compression codec {name}")
    try:
        return CODEC_NAMES[name.lower()]
    except KeyError:
        raise ValueError(
            f"compression.type must be one of {sorted(CODEC_NAMES)}, got {name!r}") from None


def compress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return bytes(cramjam.gzip.decompress(data))
    if codec == SNAPPY:
        return _snappy_decompress(bytes(data))
    if codec == LZ4:
        return bytes(cramjam.lz4.decompress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.decompress(data))
    raise ValueError(f"unknown compression codec {codec}")


def _snappy_decompress(data: bytes) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    out = []
    pos = _XERIAL_HEADER_LEN
    while pos < len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        pos += 4
        out.append(bytes(cramjam.snappy.decompress_raw(data[pos:pos + size])))
        pos += size
    return b"".join(out)


def xerial_frame(data: bytes, block_size: int = 32 * 1024) -> bytes:
    """Snappy in xerial framing, as the Java client writes it (used by tests as a read oracle)."""
    parts = [_XERIAL_MAGIC, struct.pack(">ii", 1, 1)]
    for i in range(0, max(len(data), 1), block_size):
        block = bytes(cramjam.snappy.compress_raw(data[i:i + block_size]))
        parts.append(struct.pack(">i", len(block)))
        parts.append(block)
    return b"".join(parts)
