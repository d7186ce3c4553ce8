"""The byte format of a producer-state snapshot (Kafka's `<offset>.snapshot` files).

Layout, big-endian:
  int16 version (2) | uint32 CRC-32C of every byte after it | int64 map end offset
  | int32 producer count | per producer:
    int64 producer id | int16 epoch | int32 coordinator epoch | int64 last timestamp
    | int64 open transaction's first offset (-1) | int64 its start timestamp (-1)
    | int8 cached batch count (0..5) | per batch:
      int32 last sequence | int64 last offset | int32 offset delta | int64 timestamp
      | int64 the CRC its producer sent (-1: unknown; absent in version 1, still read)

Unlike Kafka's v1, which keeps only the last batch per producer, every cached batch is kept,
so a client retrying any of its last five batches across a restart still gets its original
offsets, and a restored state equals the one a full replay of the log would build.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from crc32c import crc32c

from onceflow.log.producer_entry import NUM_BATCHES_TO_RETAIN, BatchMetadata, ProducerStateEntry
from onceflow.log.producer_errors import CorruptSnapshotError

SNAPSHOT_VERSION = 2
SNAPSHOT_SUFFIX = ".snapshot"

_PREFIX = struct.Struct(">hI")  # version, crc
_BODY_HEADER = struct.Struct(">qi")  # map end offset, producer count
_ENTRY = struct.Struct(">qhiqqqb")
_BATCHES = {1: struct.Struct(">iqiq"), 2: struct.Struct(">iqiqq")}
_BATCH = _BATCHES[SNAPSHOT_VERSION]
_NO_CRC = -1


@dataclass(frozen=True, slots=True)
class ProducerSnapshot:
    """A decoded snapshot: the log offset it covers up to (exclusive) and the producers."""

    map_end_offset: int
    entries: list[ProducerStateEntry]


def snapshot_file_name(offset: int) -> str:
    """Kafka's naming: the offset the snapshot covers up to, zero-padded to 20 digits."""
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def encode_snapshot(map_end_offset: int, entries: Iterable[ProducerStateEntry]) -> bytes:
    entries = list(entries)
    parts = [_BODY_HEADER.pack(map_end_offset, len(entries))]
    for entry in entries:
        batches = entry.batches
        parts.append(
            _ENTRY.pack(
                entry.producer_id,
                entry.producer_epoch,
                entry.coordinator_epoch,
                entry.last_timestamp,
                entry.current_txn_first_offset,
                entry.current_txn_start_timestamp,
                len(batches),
            )
        )
        parts.extend(
            _BATCH.pack(
                b.last_sequence,
                b.last_offset,
                b.offset_delta,
                b.timestamp,
                _NO_CRC if b.crc is None else b.crc,
            )
            for b in batches
        )
    body = b"".join(parts)
    return _PREFIX.pack(SNAPSHOT_VERSION, crc32c(body)) + body


def decode_snapshot(data: bytes | bytearray | memoryview) -> ProducerSnapshot:
    """Parse and check a snapshot; CorruptSnapshotError for anything but a whole, valid one."""
    view = memoryview(data)
    if len(view) < _PREFIX.size + _BODY_HEADER.size:
        raise CorruptSnapshotError(f"snapshot of {len(view)} bytes is too short")
    version, crc = _PREFIX.unpack_from(view, 0)
    if version not in _BATCHES:
        raise CorruptSnapshotError(f"unknown producer snapshot version {version}")
    body = view[_PREFIX.size :]
    computed = crc32c(body)
    if computed != crc:
        raise CorruptSnapshotError(f"snapshot CRC mismatch: stored {crc}, computed {computed}")
    try:
        return _decode_body(body, _BATCHES[version])
    except struct.error as exc:
        raise CorruptSnapshotError(f"truncated producer snapshot: {exc}") from exc


def _decode_body(body: memoryview, batch_format: struct.Struct) -> ProducerSnapshot:
    map_end_offset, count = _BODY_HEADER.unpack_from(body, 0)
    if count < 0:
        raise CorruptSnapshotError(f"negative producer count {count}")
    pos = _BODY_HEADER.size
    entries: list[ProducerStateEntry] = []
    seen: set[int] = set()
    for _ in range(count):
        (producer_id, epoch, coordinator_epoch, last_ts, txn_first, txn_start, n_batches) = (
            _ENTRY.unpack_from(body, pos)
        )
        pos += _ENTRY.size
        if not 0 <= n_batches <= NUM_BATCHES_TO_RETAIN:
            raise CorruptSnapshotError(f"producer {producer_id} has {n_batches} cached batches")
        if producer_id < 0 or producer_id in seen:
            raise CorruptSnapshotError(f"invalid or repeated producer id {producer_id}")
        seen.add(producer_id)
        batches = []
        for _ in range(n_batches):
            last_sequence, last_offset, delta, timestamp, *crc = batch_format.unpack_from(body, pos)
            pos += batch_format.size
            known = crc and crc[0] != _NO_CRC
            batch = BatchMetadata(
                last_sequence, last_offset, delta, timestamp, crc[0] if known else None
            )
            batches.append(batch)
        entries.append(
            ProducerStateEntry(
                producer_id, epoch, coordinator_epoch, last_ts, txn_first, txn_start, batches
            )
        )
    if pos != len(body):
        raise CorruptSnapshotError(f"{len(body) - pos} trailing bytes after the producer entries")
    return ProducerSnapshot(map_end_offset, entries)
