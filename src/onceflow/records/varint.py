"""Zig-zag variable-length integers, as RecordBatch v2 records use them (protobuf's encoding).

A varint holds an int32 in at most 5 bytes, a varlong an int64 in at most 10. Decoding is
bounds-checked against `end`: a truncated, over-long or out-of-range value is CorruptRecordError.
Non-minimal encodings are accepted, as Kafka's ByteUtils accepts them.
"""

from __future__ import annotations

from onceflow.records.errors import CorruptRecordError

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

Buffer = bytes | bytearray | memoryview


def _encode_unsigned(u: int) -> bytes:
    out = bytearray()
    while u > 0x7F:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


# Lengths, deltas and counts are nearly always small: their encodings come from a table.
_TABLE_LIMIT = 1 << 14
_UNSIGNED_TABLE = tuple(_encode_unsigned(u) for u in range(_TABLE_LIMIT))


def _zigzag(value: int) -> int:
    return value << 1 if value >= 0 else ((-value) << 1) - 1


def encode_varint(value: int) -> bytes:
    """Zig-zag encode an int32; ValueError outside the int32 range."""
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"{value} does not fit a varint (int32)")
    u = value << 1 if value >= 0 else ((-value) << 1) - 1
    return _UNSIGNED_TABLE[u] if u < _TABLE_LIMIT else _encode_unsigned(u)


def encode_varlong(value: int) -> bytes:
    """Zig-zag encode an int64; ValueError outside the int64 range."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"{value} does not fit a varlong (int64)")
    u = value << 1 if value >= 0 else ((-value) << 1) - 1
    return _UNSIGNED_TABLE[u] if u < _TABLE_LIMIT else _encode_unsigned(u)


def size_of_varint(value: int) -> int:
    """Bytes `encode_varint(value)` / `encode_varlong(value)` takes."""
    return max(1, (_zigzag(value).bit_length() + 6) // 7)


size_of_varlong = size_of_varint


def decode_varint(buf: Buffer, pos: int = 0, end: int | None = None) -> tuple[int, int]:
    """Decode a zig-zag int32 at `pos`; returns (value, position after it)."""
    return _decode_zigzag(buf, pos, len(buf) if end is None else end, 32, "varint")


def decode_varlong(buf: Buffer, pos: int = 0, end: int | None = None) -> tuple[int, int]:
    """Decode a zig-zag int64 at `pos`; returns (value, position after it)."""
    return _decode_zigzag(buf, pos, len(buf) if end is None else end, 64, "varlong")


def _decode_zigzag(buf: Buffer, pos: int, end: int, bits: int, what: str) -> tuple[int, int]:
    if pos < end and buf[pos] < 0x80:  # one byte: the common case
        byte = buf[pos]
        return (byte >> 1) ^ -(byte & 1), pos + 1
    max_shift = 7 * ((bits + 6) // 7)  # 5 bytes for 32 bits, 10 for 64
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise CorruptRecordError(f"truncated {what}")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
        if shift >= max_shift:
            raise CorruptRecordError(f"{what} longer than {max_shift // 7} bytes")
    if result >> bits:
        raise CorruptRecordError(f"{what} out of the int{bits} range")
    return (result >> 1) ^ -(result & 1), pos
