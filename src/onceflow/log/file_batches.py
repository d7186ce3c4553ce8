"""Walk the batches of a segment file with positioned reads, chunk by chunk.

Shared by recovery (CRC-checked scan of a tail that may be torn), index rebuilds, offset
lookups and replay; never reads a whole file at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from onceflow.log.errors import CorruptSegmentError
from onceflow.records.batch import (
    CURRENT_MAGIC,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    BatchHeader,
    compute_crc,
    parse_header,
)

SCAN_CHUNK_BYTES = 64 * 1024
"""Default read size: large enough to amortise syscalls, small enough for an offset lookup."""


Pread = Callable[[int, int], bytes]
"""pread(length, position): a positioned read (FileHandle.pread pins the file per call)."""


def iter_file_batches(
    pread: Pread,
    start: int,
    end: int,
    *,
    verify_crc: bool = False,
    with_bytes: bool = False,
    chunk_bytes: int = SCAN_CHUNK_BYTES,
) -> Iterator[tuple[int, BatchHeader, bytes | None]]:
    """Yield (position, header, batch bytes or None) for each batch in file bytes [start, end).

    Raises CorruptSegmentError (with the position of the offending batch) at the first batch
    that is truncated, has an impossible length, a wrong magic byte or (with verify_crc) a
    bad CRC; callers that recover truncate the file at that position.
    """
    buf = b""
    buf_start = start
    pos = start
    while pos < end:
        remaining = end - pos
        if remaining < HEADER_SIZE:
            raise CorruptSegmentError(f"{remaining} trailing bytes do not form a batch", pos)
        off = pos - buf_start
        if off + HEADER_SIZE > len(buf):
            buf = _pread_exactly(pread, min(max(chunk_bytes, HEADER_SIZE), remaining), pos)
            buf_start, off = pos, 0
        magic = buf[off + MAGIC_OFFSET]
        if magic != CURRENT_MAGIC:
            raise CorruptSegmentError(f"magic byte {magic} where a v2 batch should start", pos)
        header = parse_header(buf, off)
        if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
            raise CorruptSegmentError(f"batch length {header.batch_length} is too small", pos)
        size = header.size
        if size > remaining:
            raise CorruptSegmentError(
                f"batch of {size} bytes runs past the end of the file ({remaining} left)", pos
            )
        data: bytes | None = None
        if verify_crc or with_bytes:
            if off + size > len(buf):
                buf = _pread_exactly(pread, min(max(chunk_bytes, size), remaining), pos)
                buf_start, off = pos, 0
            if verify_crc and compute_crc(buf, off, size) != header.crc:
                raise CorruptSegmentError("CRC mismatch", pos)
            if with_bytes:
                data = buf[off : off + size]
        yield pos, header, data
        pos += size


def _pread_exactly(pread: Pread, length: int, pos: int) -> bytes:
    data = pread(length, pos)
    if len(data) < length:
        # The file shrank under us or the caller's end is wrong: either way not a batch.
        raise CorruptSegmentError(f"file ends after {len(data)} of {length} bytes", pos)
    return data
