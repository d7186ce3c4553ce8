"""Record-batch compression codecs, framed the way Kafka clients frame them.

Codec ids are the batch attribute bits 0-2: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.

- gzip: a gzip stream (several concatenated members are accepted, as Java's GZIPInputStream does).
- snappy: the Java client writes snappy-java's "xerial" framing (a 16-byte header, then blocks of
  int32 length + raw snappy, each of at most 32 KiB input); librdkafka may send raw snappy. We
  read both and write xerial, which every client reads.
- lz4: the LZ4 frame format with independent blocks; Java's reader refuses linked blocks, so we
  write independent 64 KiB blocks without checksums, the frame Java's Lz4BlockOutputStream writes.
- zstd: a zstd frame (several concatenated frames are accepted).
"""

from __future__ import annotations

import struct
from enum import IntEnum

import cramjam

from onceflow.records.errors import UnsupportedCompressionError


class CompressionType(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


XERIAL_MAGIC = b"\x82SNAPPY\x00"
# magic, then int32 version 1 and int32 minimum compatible version 1, as snappy-java writes them
XERIAL_HEADER = XERIAL_MAGIC + b"\x00\x00\x00\x01\x00\x00\x00\x01"
XERIAL_BLOCK_SIZE = 32 * 1024

LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"
# FLG 0x60 (version 1, independent blocks, no checksums), BD 0x40 (64 KiB blocks) and the header
# checksum byte (xxh32(FLG BD) >> 8) & 0xFF: the 7 bytes Java's Lz4BlockOutputStream writes.
LZ4_FRAME_HEADER = LZ4_FRAME_MAGIC + b"\x60\x40\x82"
LZ4_BLOCK_SIZE = 64 * 1024
_LZ4_UNCOMPRESSED_BIT = 0x80000000
_LZ4_END_MARK = b"\x00\x00\x00\x00"

_INT32_BE = struct.Struct(">i")
_UINT32_LE = struct.Struct("<I")

# cramjam's levels default to the codec's own default; Kafka's defaults are the same ones
# (gzip 6 through Java's Deflater default, zstd 3), lz4 uses the fast compressor like Java.


def compression_type(codec: int) -> CompressionType:
    """The codec for a batch's codec id; UnsupportedCompressionError for ids Kafka lacks."""
    try:
        return CompressionType(codec)
    except ValueError:
        raise UnsupportedCompressionError(f"unknown compression codec id {codec}") from None


def compress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """Compress a batch's records section with `codec`, framed as the Java client frames it."""
    kind = compression_type(codec)
    if kind is CompressionType.NONE:
        return bytes(data)
    if kind is CompressionType.GZIP:
        return bytes(cramjam.gzip.compress(data))
    if kind is CompressionType.SNAPPY:
        return _xerial_compress(data)
    if kind is CompressionType.LZ4:
        return _lz4_frame_compress(data)
    return bytes(cramjam.zstd.compress(data))


def _xerial_compress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    parts = [XERIAL_HEADER]
    for start in range(0, len(view), XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + XERIAL_BLOCK_SIZE]))
        parts.append(_INT32_BE.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _lz4_frame_compress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data)
    parts = [LZ4_FRAME_HEADER]
    for start in range(0, len(view), LZ4_BLOCK_SIZE):
        chunk = view[start : start + LZ4_BLOCK_SIZE]
        block = bytes(cramjam.lz4.compress_block(chunk, store_size=False))
        if len(block) >= len(chunk):
            # incompressible: stored as is, flagged by the block size's high bit
            parts.append(_UINT32_LE.pack(len(chunk) | _LZ4_UNCOMPRESSED_BIT))
            parts.append(bytes(chunk))
        else:
            parts.append(_UINT32_LE.pack(len(block)))
            parts.append(block)
    parts.append(_LZ4_END_MARK)
    return b"".join(parts)
