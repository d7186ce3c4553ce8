"""The embedded consumer protocol of classic groups (Kafka's ConsumerProtocol): the
ConsumerProtocolSubscription a member sends in JoinGroup and the ConsumerProtocolAssignment the
leader hands out in SyncGroup, as the coordinator reads and writes them when a classic member
lives in a consumer group (KIP-848's online upgrade and downgrade).

Both are non-flexible: an int16 version, then the fields of that version (int16-length strings,
int32-count arrays). A version above the latest known is read as the latest, as Kafka does.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")

SUBSCRIPTION_LATEST_VERSION = 3
ASSIGNMENT_LATEST_VERSION = 3


class ConsumerProtocolError(ValueError):
    """Malformed embedded consumer protocol bytes (Kafka's SchemaException)."""


@dataclass(frozen=True)
class Subscription:
    topics: tuple[str, ...]
    owned_partitions: dict[str, frozenset[int]]
    generation_id: int = -1
    rack_id: str | None = None


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def _unpack(self, fmt: struct.Struct) -> int:
        if self.pos + fmt.size > len(self.data):
            raise ConsumerProtocolError("unexpected end of the consumer protocol bytes")
        (value,) = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return int(value)

    def int16(self) -> int:
        return self._unpack(_INT16)

    def int32(self) -> int:
        return self._unpack(_INT32)

    def count(self) -> int:
        n = self.int32()
        if n < -1 or n > len(self.data) - self.pos:
            raise ConsumerProtocolError(f"bad array length {n}")
        return max(n, 0)

    def string(self, nullable: bool = False) -> str | None:
        n = self.int16()
        if n < 0:
            if nullable:
                return None
            raise ConsumerProtocolError("null string")
        if self.pos + n > len(self.data):
            raise ConsumerProtocolError("string past the end")
        raw = self.data[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConsumerProtocolError("string is not UTF-8") from None

    def nullable_bytes(self) -> None:
        n = self.int32()
        if n > len(self.data) - self.pos:
            raise ConsumerProtocolError("bytes past the end")
        self.pos += max(n, 0)

    def topic_partitions(self) -> dict[str, frozenset[int]]:
        out: dict[str, frozenset[int]] = {}
        for _ in range(self.count()):
            topic = self.string()
            assert topic is not None
            partitions = frozenset(self.int32() for _ in range(self.count()))
            out[topic] = out.get(topic, frozenset()) | partitions
        return out


def version(data: bytes) -> int:
    """The version of a subscription or assignment (Kafka's deserializeVersion)."""
    return _Reader(data).int16()


def decode_subscription(data: bytes) -> Subscription:
    """Raises ConsumerProtocolError for bytes that are not a subscription."""
    r = _Reader(data)
    v = min(r.int16(), SUBSCRIPTION_LATEST_VERSION)
    if v < 0:
        raise ConsumerProtocolError(f"negative subscription version {v}")
    topics = []
    for _ in range(r.count()):
        topic = r.string()
        assert topic is not None
        topics.append(topic)
    r.nullable_bytes()  # user data
    owned = r.topic_partitions() if v >= 1 else {}
    generation = r.int32() if v >= 2 else -1
    rack = r.string(nullable=True) if v >= 3 else None
    return Subscription(tuple(topics), owned, generation, rack)


def decode_assignment(data: bytes) -> dict[str, frozenset[int]]:
    """The assigned partitions by topic name. No bytes at all (a member that never got an
    assignment) is no partitions. Raises ConsumerProtocolError for malformed bytes."""
    if not data:
        return {}
    r = _Reader(data)
    if r.int16() < 0:
        raise ConsumerProtocolError("negative assignment version")
    assigned = r.topic_partitions()
    r.nullable_bytes()  # user data
    return assigned


def encode_assignment(assigned: Mapping[str, frozenset[int]], at_version: int) -> bytes:
    """A ConsumerProtocolAssignment (no user data) in ``at_version`` (0..3; every version has
    the same fields)."""
    v = max(0, min(at_version, ASSIGNMENT_LATEST_VERSION))
    out = [_INT16.pack(v), _INT32.pack(len(assigned))]
    for topic in sorted(assigned):
        name = topic.encode()
        partitions = sorted(assigned[topic])
        out.append(_INT16.pack(len(name)) + name + _INT32.pack(len(partitions)))
        out.extend(_INT32.pack(p) for p in partitions)
    out.append(_INT32.pack(-1))
    return b"".join(out)


__all__ = [
    "ConsumerProtocolError",
    "Subscription",
    "decode_assignment",
    "decode_subscription",
    "encode_assignment",
    "version",
]
