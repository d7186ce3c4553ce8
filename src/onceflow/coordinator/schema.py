"""The encoding of the coordinators' log records, as Kafka's generated message classes write them.

The keys and values of ``__consumer_offsets`` and ``__transaction_state`` are Kafka "messages":
big-endian fixed-width integers, strings with an int16 length (a compact string, in flexible
versions, has an unsigned varint length + 1), and in flexible versions tagged fields (a varint
count, then tag, size and bytes for each). Each log's module states its own layouts with these;
every read is bounds-checked and raises the error type that module gives, so a record that
cannot be decoded is that log's typed error.
"""

from __future__ import annotations

import struct

INT8 = struct.Struct(">b")
INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")

_MAX_INT16_STRING = 0x7FFF
_MAX_UVARINT_BYTES = 5


def encode_uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_string(s: str, error: type[Exception]) -> bytes:
    """An int16-length string; `error` when it does not fit."""
    raw = s.encode("utf-8")
    if len(raw) > _MAX_INT16_STRING:
        raise error(f"string of {len(raw)} bytes does not fit an int16 length")
    return INT16.pack(len(raw)) + raw


def encode_compact_string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return encode_uvarint(len(raw) + 1) + raw


def encode_tagged_field(tag: int, data: bytes) -> bytes:
    return encode_uvarint(tag) + encode_uvarint(len(data)) + data


class SchemaReader:
    """Bounds-checked cursor over one key or value; every fault raises `error`."""

    def __init__(self, buf: bytes, error: type[Exception]) -> None:
        self.buf = buf
        self.pos = 0
        self._error = error

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise self._error(
                f"truncated record: {n} bytes wanted at {self.pos} of {len(self.buf)}"
            )
        chunk = self.buf[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: struct.Struct) -> int:
        value: int = fmt.unpack(self.take(fmt.size))[0]
        return value

    def uvarint(self) -> int:
        result = 0
        for shift in range(0, 7 * _MAX_UVARINT_BYTES, 7):
            byte = self.take(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
        raise self._error(f"unsigned varint longer than {_MAX_UVARINT_BYTES} bytes")

    def string(self) -> str:
        length = self.unpack(INT16)
        if length < 0:
            raise self._error("null string where a string is required")
        return self._utf8(self.take(length))

    def compact_string(self) -> str:
        length = self.uvarint() - 1
        if length < 0:
            raise self._error("null compact string where a string is required")
        return self._utf8(self.take(length))

    def tagged_fields(self) -> dict[int, bytes]:
        """The tagged fields here, by tag (a reader keeps those it knows)."""
        fields: dict[int, bytes] = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            fields[tag] = self.take(self.uvarint())
        return fields

    def end(self) -> None:
        """Nothing may follow the last field."""
        if self.pos != len(self.buf):
            raise self._error(f"{len(self.buf) - self.pos} trailing bytes in record")

    def _utf8(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._error(f"invalid UTF-8 string: {exc}") from exc
