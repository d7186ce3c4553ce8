"""Batches framed by hand around any records section, independently of onceflow's builder,
so that tests can frame content it would refuse."""

from __future__ import annotations

import struct
from collections.abc import Callable

from crc32c import crc32c

_HEADER = struct.Struct(">qiibIhiqqqhii")

Frame = Callable[..., bytes]


def frame_batch(
    section: bytes,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    magic: int = 2,
    attributes: int = 0,
    last_offset_delta: int = 0,
    base_timestamp: int = 0,
    max_timestamp: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    records_count: int = 0,
    crc: int | None = None,
) -> bytes:
    """A batch around an arbitrary records section, with a correct length and CRC by default.

    Written independently of onceflow's builder, so tests can frame content it would refuse.
    """
    out = bytearray(
        _HEADER.pack(
            base_offset,
            49 + len(section),
            partition_leader_epoch,
            magic,
            0,
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            records_count,
        )
    )
    out += section
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])) if crc is None else crc)
    return bytes(out)


def refresh_crc(batch: bytes | bytearray) -> bytes:
    """The same bytes with the CRC field recomputed over what follows it."""
    out = bytearray(batch)
    if len(out) >= 21:
        struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)
