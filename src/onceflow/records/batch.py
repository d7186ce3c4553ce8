"""RecordBatch v2 headers: parse, validate and patch them in place, without decoding records.

Layout (all big-endian), offsets in bytes from the start of the batch:
  0 baseOffset int64 | 8 batchLength int32 | 12 partitionLeaderEpoch int32 | 16 magic int8
  17 crc uint32 (CRC-32C of bytes 21..end) | 21 attributes int16 | 23 lastOffsetDelta int32
  27 baseTimestamp int64 | 35 maxTimestamp int64 | 43 producerId int64 | 51 producerEpoch int16
  53 baseSequence int32 | 57 recordsCount int32 | 61 records...
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, fields

from crc32c import crc32c

from onceflow.records.errors import CorruptRecordError, RecordsError, UnsupportedMagicError

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the part not counted in batchLength
CRC_START = 21
MAGIC_OFFSET = 16
CURRENT_MAGIC = 2

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08  # 0 = CreateTime, 1 = LogAppendTime
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
DELETE_HORIZON_FLAG = 0x40

# The whole header, in BatchHeader's field order (the builder and the cleaner pack it).
_HEADER_FORMAT = ">qiibIhiqqqhii"
HEADER_LAYOUT = struct.Struct(_HEADER_FORMAT)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed 61-byte header of one RecordBatch v2."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies, header included."""
        return LOG_OVERHEAD + self.batch_length

    def placed(self, base_offset: int, partition_leader_epoch: int) -> BatchHeader:
        """This header at its offset in a log, written by that leader epoch. (What
        dataclasses.replace does, at a quarter of its cost: it runs for every appended batch.)"""
        return BatchHeader(
            base_offset,
            self.batch_length,
            partition_leader_epoch,
            self.magic,
            self.crc,
            self.attributes,
            self.last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.records_count,
        )

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record, wrapping at Int32.MAX as Kafka does."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % (1 << 31)


class _HeaderField:
    """One field of the header, located from HEADER_LAYOUT, for reading or patching it in place."""

    def __init__(self, name: str) -> None:
        index = [f.name for f in fields(BatchHeader)].index(name)
        codes = _HEADER_FORMAT[1:]
        self.at = struct.calcsize(">" + codes[:index])
        self.layout = struct.Struct(">" + codes[index])

    def read(self, buf: bytes | bytearray | memoryview, pos: int) -> int:
        value: int = self.layout.unpack_from(buf, pos + self.at)[0]
        return value

    def write(self, buf: bytearray | memoryview, pos: int, value: int) -> None:
        self.layout.pack_into(buf, pos + self.at, value)


_BASE_OFFSET = _HeaderField("base_offset")
_BATCH_LENGTH = _HeaderField("batch_length")
_PARTITION_LEADER_EPOCH = _HeaderField("partition_leader_epoch")
_CRC = _HeaderField("crc")
_ATTRIBUTES = _HeaderField("attributes")
_LAST_OFFSET_DELTA = _HeaderField("last_offset_delta")
_MAX_TIMESTAMP = _HeaderField("max_timestamp")


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the header at `pos`; raises CorruptRecordError if it is not all there."""
    if len(buf) - pos < HEADER_SIZE:
        if len(buf) - pos > MAGIC_OFFSET and buf[pos + MAGIC_OFFSET] in (0, 1):
            raise UnsupportedMagicError(
                f"message format v{buf[pos + MAGIC_OFFSET]} is not supported"
            )
        raise CorruptRecordError("truncated record batch header")
    return BatchHeader(*HEADER_LAYOUT.unpack_from(buf, pos))


def compute_crc(buf: bytes | bytearray | memoryview, pos: int, size: int) -> int:
    return crc32c(memoryview(buf)[pos + CRC_START : pos + size])


def iter_batches(
    buf: bytes | bytearray | memoryview, *, verify_crc: bool = True
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) of each complete, valid batch in `buf`.

    Raises CorruptRecordError at the first batch that is truncated, has a bad length
    or a bad CRC; UnsupportedMagicError for a v0/v1 message set.
    """
    pos = 0
    end = len(buf)
    while pos < end:
        if end - pos < LOG_OVERHEAD + 5:
            raise CorruptRecordError(f"{end - pos} trailing bytes do not form a batch")
        magic = buf[pos + MAGIC_OFFSET]
        if magic != CURRENT_MAGIC:
            if magic in (0, 1):
                raise UnsupportedMagicError(f"message format v{magic} is not supported")
            raise CorruptRecordError(f"unknown magic byte {magic}")
        header = parse_header(buf, pos)
        if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
            raise CorruptRecordError(f"batch length {header.batch_length} is below the minimum")
        if pos + header.size > end:
            raise CorruptRecordError("record batch extends past the end of the data")
        if verify_crc and compute_crc(buf, pos, header.size) != header.crc:
            raise CorruptRecordError(f"CRC mismatch in batch at byte {pos}")
        yield pos, header
        pos += header.size


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Rewrite a batch's base offset in place (outside the CRC, so the CRC stays valid)."""
    _BASE_OFFSET.write(buf, pos, base_offset)


def set_partition_leader_epoch(buf: bytearray | memoryview, pos: int, epoch: int) -> None:
    """Rewrite a batch's partition leader epoch in place (also outside the CRC)."""
    _PARTITION_LEADER_EPOCH.write(buf, pos, epoch)


# The fields below are inside the CRC: `set_crc` once they are all written.


def set_attributes(buf: bytearray | memoryview, pos: int, attributes: int) -> None:
    _ATTRIBUTES.write(buf, pos, attributes)


def set_last_offset_delta(buf: bytearray | memoryview, pos: int, delta: int) -> None:
    _LAST_OFFSET_DELTA.write(buf, pos, delta)


def set_max_timestamp(buf: bytearray | memoryview, pos: int, timestamp: int) -> None:
    _MAX_TIMESTAMP.write(buf, pos, timestamp)


def set_crc(buf: bytearray | memoryview, pos: int, size: int) -> int:
    """Compute the CRC of the batch of `size` bytes at `pos` and store it; returns it."""
    crc = compute_crc(buf, pos, size)
    _CRC.write(buf, pos, crc)
    return crc


def batch_size_at(buf: bytes | bytearray | memoryview, pos: int) -> int:
    """Total size of the batch at `pos` as its length field claims (unvalidated)."""
    return LOG_OVERHEAD + _BATCH_LENGTH.read(buf, pos)


def check_batch(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, verify_crc: bool = True
) -> BatchHeader:
    """Parse the batch at `pos` and check its framing: magic 2, length, CRC.

    Unlike `iter_batches` it looks at one batch only, so the bytes after it may be anything.
    Raises UnsupportedMagicError for v0/v1, CorruptRecordError for anything else wrong.
    """
    if pos < 0 or len(buf) - pos < HEADER_SIZE:
        if pos >= 0 and len(buf) - pos > MAGIC_OFFSET and buf[pos + MAGIC_OFFSET] in (0, 1):
            raise UnsupportedMagicError(
                f"message format v{buf[pos + MAGIC_OFFSET]} is not supported"
            )
        raise CorruptRecordError("truncated record batch header")
    magic = buf[pos + MAGIC_OFFSET]
    if magic != CURRENT_MAGIC:
        if magic in (0, 1):
            raise UnsupportedMagicError(f"message format v{magic} is not supported")
        raise CorruptRecordError(f"unknown magic byte {magic}")
    header = BatchHeader(*HEADER_LAYOUT.unpack_from(buf, pos))
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptRecordError(f"batch length {header.batch_length} is below the minimum")
    if header.size > len(buf) - pos:
        raise CorruptRecordError("record batch extends past the end of the data")
    if verify_crc and compute_crc(buf, pos, header.size) != header.crc:
        raise CorruptRecordError(f"CRC mismatch in batch at byte {pos}")
    return header


def transactional_header(buf: bytes | bytearray | memoryview) -> BatchHeader | None:
    """The header of the first batch in `buf` if that batch is transactional, as Kafka's
    RequestUtils.hasTransactionalRecords looks at a Produce before validating it: the first
    whole v2 batch only, CRC unchecked. None for anything else (validation refuses it later)."""
    try:
        header = check_batch(buf, verify_crc=False)
    except RecordsError:
        return None
    return header if header.is_transactional else None
