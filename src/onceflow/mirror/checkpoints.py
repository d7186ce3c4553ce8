"""MirrorMaker 2's checkpoint records, in `{alias}.checkpoints.internal` on the target: for a
consumer group and a target partition, the group's source offset and its translation.

Same topic name and the same bytes as MM2's Checkpoint (Kafka protocol types, big-endian; a
STRING is an INT16 length then UTF-8): key = group STRING, topic STRING, partition INT32;
value = version INT16 (0), upstreamOffset INT64, offset INT64, metadata STRING. So MM2's
RemoteClusterUtils.translateOffsets and tools that read the topic understand it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

VERSION = 0


class CheckpointError(ValueError):
    """Bytes that are not a version-0 checkpoint."""


def checkpoints_topic(alias: str) -> str:
    return f"{alias}.checkpoints.internal"


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def _read_string(data: bytes, at: int) -> tuple[str, int]:
    (size,) = struct.unpack_from(">h", data, at)
    at += 2
    if size < 0 or at + size > len(data):
        raise CheckpointError(f"string of {size} bytes at {at - 2}")
    return data[at : at + size].decode(), at + size


@dataclass(frozen=True)
class Checkpoint:
    group: str
    topic: str  # the target topic
    partition: int
    upstream_offset: int
    offset: int
    metadata: str = ""

    def key(self) -> bytes:
        return _string(self.group) + _string(self.topic) + struct.pack(">i", self.partition)

    def value(self) -> bytes:
        return struct.pack(">hqq", VERSION, self.upstream_offset, self.offset) + _string(
            self.metadata
        )

    @classmethod
    def decode(cls, key: bytes, value: bytes) -> Checkpoint:
        try:
            group, at = _read_string(key, 0)
            topic, at = _read_string(key, at)
            (partition,) = struct.unpack_from(">i", key, at)
            version, upstream, offset = struct.unpack_from(">hqq", value, 0)
            metadata, _ = _read_string(value, 18)
        except (struct.error, UnicodeDecodeError) as exc:
            raise CheckpointError(f"not a checkpoint: {exc}") from exc
        if version != VERSION:
            raise CheckpointError(f"checkpoint version {version}")
        return cls(group, topic, partition, upstream, offset, metadata)
