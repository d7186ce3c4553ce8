"""Bounded streaming decompression of a batch's records section, for validation and search.

`iter_decompressed` yields the decompressed bytes in chunks and never holds more than one
chunk (or one codec block) at a time, so a 131 KB zstd batch that claims 4 GiB of zeros costs
one chunk of memory and is refused as soon as it passes `limit` (RecordTooLargeError: Kafka's
MESSAGE_TOO_LARGE, on which Java and librdkafka producers split the batch and retry, so an
honest large batch still gets through). Malformed compressed data is CorruptRecordError.

Per codec:
- gzip: zlib with max_length, member after member (as Java's GZIPInputStream, bytes after the
  last member that do not start a new one are ignored).
- snappy: xerial blocks (or one raw snappy block, as librdkafka sends it). Raw snappy cannot be
  decoded in pieces, so each block's uncompressed-length preamble is checked against `limit`
  before it is decompressed whole: memory is one block (32 KiB from Java, the whole batch from
  librdkafka), never more than `limit`.
- lz4: the frame block by block, each into a buffer of the frame's maximum block size (<= 4 MiB).
  Linked blocks (which Python clients may send) refer to the output before them, so such a frame
  is decoded whole, once its blocks x maximum block size is known to be within `limit`.
- zstd: backports.zstd's decompressor with max_length (cramjam's zstd is one-shot), frame
  after frame.
"""

from __future__ import annotations

import struct
import sys
import zlib
from collections.abc import Iterator

import cramjam

try:
    from compression import zstd  # Python 3.14+
except ImportError:
    from backports import zstd

from onceflow.records.compression import (
    LZ4_FRAME_MAGIC,
    XERIAL_HEADER,
    XERIAL_MAGIC,
    CompressionType,
    compression_type,
)
from onceflow.records.errors import CorruptRecordError, RecordTooLargeError

CHUNK_SIZE = 256 * 1024  # decompressed bytes handed to the record walker at a time
DEFAULT_MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024

Buffer = bytes | bytearray | memoryview

_INT32_BE = struct.Struct(">i")
_UINT32_LE = struct.Struct("<I")
_GZIP_MAGIC = b"\x1f\x8b"
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer, as Kafka's GZIPInputStream wants
_LZ4_BLOCK_SIZES = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}
_LZ4_UNCOMPRESSED_BIT = 0x80000000


def decompress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """Decompress a batch's records section whole; malformed input raises CorruptRecordError.

    For batches the broker wrote itself or already validated (control batches, internal logs,
    clients' reads); anything a client sent goes through decompression.iter_decompressed, which
    is bounded. Both decode the same way, so what validation accepts this decodes.
    """
    if compression_type(codec) is CompressionType.NONE:
        return bytes(data)
    return b"".join(bytes(chunk) for chunk in iter_decompressed(codec, data, sys.maxsize))


def iter_decompressed(codec: int, data: Buffer, limit: int) -> Iterator[Buffer]:
    """Decompress `data` (compressed with `codec`) as a stream of chunks.

    Raises RecordTooLargeError once more than `limit` bytes come out, CorruptRecordError for
    malformed or truncated input, UnsupportedCompressionError for unknown codec ids.
    """
    kind = compression_type(codec)
    if kind is CompressionType.NONE:
        yield data
        return
    if kind is CompressionType.GZIP:
        chunks = _gzip(data)
    elif kind is CompressionType.SNAPPY:
        chunks = _snappy(data, limit)
    elif kind is CompressionType.LZ4:
        chunks = _lz4(data, limit)
    else:
        chunks = _zstd(data)
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise RecordTooLargeError(
                f"{kind.name.lower()} batch decompresses to more than {limit} bytes"
            )
        yield chunk


def _gzip(data: Buffer) -> Iterator[bytes]:
    pending: Buffer = data
    decompressor = zlib.decompressobj(_GZIP_WBITS)
    try:
        while True:
            out = decompressor.decompress(pending, CHUNK_SIZE)
            progressed = bool(out) or len(decompressor.unconsumed_tail) != len(pending)
            pending = decompressor.unconsumed_tail
            if out:
                yield out
            if decompressor.eof:
                rest = decompressor.unused_data
                if not rest.startswith(_GZIP_MAGIC):
                    return
                pending, decompressor = rest, zlib.decompressobj(_GZIP_WBITS)
            elif not progressed:
                raise CorruptRecordError("truncated gzip data")
    except zlib.error as exc:
        raise CorruptRecordError(f"cannot decompress gzip data: {exc}") from exc


def _snappy(data: Buffer, limit: int) -> Iterator[bytes]:
    view = memoryview(data)
    if len(view) < len(XERIAL_HEADER) or view[: len(XERIAL_MAGIC)] != XERIAL_MAGIC:
        # snappy-java reads raw snappy when the xerial header is absent: librdkafka relies on it
        yield _snappy_block(view, limit)
        return
    pos = len(XERIAL_HEADER)
    end = len(view)
    budget = limit
    while pos < end:
        if end - pos < 4:
            raise CorruptRecordError("truncated xerial snappy block length")
        (size,) = _INT32_BE.unpack_from(view, pos)
        pos += 4
        if size < 0 or size > end - pos:
            raise CorruptRecordError(f"xerial snappy block length {size} out of range")
        block = _snappy_block(view[pos : pos + size], budget)
        budget -= len(block)
        pos += size
        yield block


def _snappy_block(block: memoryview, limit: int) -> bytes:
    # The preamble is the block's uncompressed length (little-endian base 128): check it first,
    # since the decoder allocates that much at once.
    length = 0
    for i in range(min(5, len(block))):
        length |= (block[i] & 0x7F) << (7 * i)
        if block[i] < 0x80:
            break
    else:
        raise CorruptRecordError("snappy block has no valid length preamble")
    if length > limit:
        raise RecordTooLargeError(f"snappy block decompresses to {length} bytes, past {limit}")
    try:
        return bytes(cramjam.snappy.decompress_raw(block))
    except cramjam.DecompressionError as exc:
        raise CorruptRecordError(f"cannot decompress snappy data: {exc}") from exc


def _lz4(data: Buffer, limit: int) -> Iterator[Buffer]:
    view = memoryview(data)
    pos, end = 0, len(view)
    while pos < end:  # frame after frame
        frame_start = pos
        pos, block_max, flags = _lz4_frame_header(view, pos)
        block_checksum, content_checksum = bool(flags & 0x10), bool(flags & 0x04)
        if not flags & 0x20:  # linked blocks
            pos = _lz4_frame_end(view, pos, block_max, block_checksum, content_checksum, limit)
            try:
                yield bytes(cramjam.lz4.decompress(view[frame_start:pos]))
            except cramjam.DecompressionError as exc:
                raise CorruptRecordError(f"cannot decompress lz4 frame: {exc}") from exc
            continue
        out = bytearray(block_max)
        while True:
            if end - pos < 4:
                raise CorruptRecordError("truncated lz4 block size")
            (size,) = _UINT32_LE.unpack_from(view, pos)
            pos += 4
            if size == 0:  # end mark
                break
            stored = bool(size & _LZ4_UNCOMPRESSED_BIT)
            size &= ~_LZ4_UNCOMPRESSED_BIT
            if size > block_max or size > end - pos:
                raise CorruptRecordError(f"lz4 block size {size} out of range")
            block = view[pos : pos + size]
            pos += size + (4 if block_checksum else 0)
            if stored:
                yield block
                continue
            try:
                n = cramjam.lz4.decompress_block_into(block, out, output_len=block_max)
            except cramjam.DecompressionError as exc:
                raise CorruptRecordError(f"cannot decompress lz4 block: {exc}") from exc
            # a fresh view each time: the consumer is done with the previous chunk by now
            yield memoryview(out)[:n]
        pos += 4 if content_checksum else 0
        if pos > end:
            raise CorruptRecordError("truncated lz4 frame")


def _lz4_frame_end(
    view: memoryview,
    pos: int,
    block_max: int,
    block_checksum: bool,
    content_checksum: bool,
    limit: int,
) -> int:
    """Where the frame whose blocks start at `pos` ends, after checking that its blocks cannot
    decompress to more than `limit` bytes."""
    end = len(view)
    blocks = 0
    while True:
        if end - pos < 4:
            raise CorruptRecordError("truncated lz4 block size")
        (size,) = _UINT32_LE.unpack_from(view, pos)
        pos += 4
        if size == 0:
            break
        size &= ~_LZ4_UNCOMPRESSED_BIT
        if size > block_max or size > end - pos:
            raise CorruptRecordError(f"lz4 block size {size} out of range")
        pos += size + (4 if block_checksum else 0)
        blocks += 1
        if blocks * block_max > limit:
            raise RecordTooLargeError(f"lz4 frame of linked blocks may exceed {limit} bytes")
    pos += 4 if content_checksum else 0
    if pos > end:
        raise CorruptRecordError("truncated lz4 frame")
    return pos


def _lz4_frame_header(view: memoryview, pos: int) -> tuple[int, int, int]:
    """Parse a frame descriptor at `pos`: (position after it, max block size, FLG byte).
    The header checksum byte is not verified (old Kafka clients wrote a wrong one)."""
    if len(view) - pos < 7 or view[pos : pos + 4] != LZ4_FRAME_MAGIC:
        raise CorruptRecordError("not an lz4 frame")
    flg, bd = view[pos + 4], view[pos + 5]
    if flg >> 6 != 1:
        raise CorruptRecordError(f"unsupported lz4 frame version {flg >> 6}")
    if flg & 0x01:
        raise CorruptRecordError("lz4 frames with a dictionary id are not supported")
    block_max = _LZ4_BLOCK_SIZES.get((bd >> 4) & 0x07)
    if block_max is None:
        raise CorruptRecordError(f"invalid lz4 block maximum size id {(bd >> 4) & 0x07}")
    header_end = pos + 6 + (8 if flg & 0x08 else 0) + 1
    if header_end > len(view):
        raise CorruptRecordError("truncated lz4 frame header")
    return header_end, block_max, flg


def _zstd(data: Buffer) -> Iterator[bytes]:
    pending: Buffer = data
    decompressor = zstd.ZstdDecompressor()
    try:
        while True:
            out = decompressor.decompress(pending, CHUNK_SIZE)
            pending = b""
            if out:
                yield out
            if decompressor.eof:
                pending = decompressor.unused_data
                if not pending:
                    return
                decompressor = zstd.ZstdDecompressor()
            elif not out and decompressor.needs_input:
                raise CorruptRecordError("truncated zstd data")
    except zstd.ZstdError as exc:
        raise CorruptRecordError(f"cannot decompress zstd data: {exc}") from exc
