"""The cleaner's key -> latest offset map, bounded like Kafka's SkimpyOffsetMap.

A fixed table of `memory // 24` slots in one bytearray: each slot a 16-byte MD5 of the key and
the key's latest offset (int64), open addressing as Kafka probes (4-byte windows of the hash
first, then linear). Memory is the budget whatever the key sizes, and never grows.

Kafka sizes it from `log.cleaner.dedupe.buffer.size` (128 MiB, shared by the cleaner threads)
and fills it only to `log.cleaner.io.buffer.load.factor` (0.9) of its slots; when it is that
full, building the map stops and that round cleans only up to the last offset mapped
(`latest_offset`), the rest next round. A 16-byte hash collision would merge two keys, a risk
Kafka accepts too (about 2^-64 for a billion keys).
"""

from __future__ import annotations

import hashlib
import struct

from onceflow.compaction.errors import OffsetMapConfigError

DEFAULT_DEDUPE_BUFFER_SIZE = 128 * 1024 * 1024  # log.cleaner.dedupe.buffer.size
DEFAULT_IO_BUFFER_LOAD_FACTOR = 0.9  # log.cleaner.io.buffer.load.factor
HASH_SIZE = 16  # MD5, Kafka's log.cleaner.hash.algorithm default
BYTES_PER_ENTRY = HASH_SIZE + 8  # hash + int64 offset

_OFFSET = struct.Struct(">q")
_WINDOW = struct.Struct(">i")
_EMPTY_SLOT = bytes(BYTES_PER_ENTRY)
_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1


class OffsetMap:
    """Key hash -> latest offset, in a fixed `memory`-byte table (Kafka's SkimpyOffsetMap).

    Reusable: `clear()` between cleaning rounds, as Kafka's cleaner thread reuses its map.
    """

    __slots__ = ("_slots", "_table", "capacity", "entries", "latest_offset", "lookups", "probes")

    def __init__(
        self,
        memory: int = DEFAULT_DEDUPE_BUFFER_SIZE,
        load_factor: float = DEFAULT_IO_BUFFER_LOAD_FACTOR,
    ) -> None:
        if not 0 < load_factor <= 1:
            raise OffsetMapConfigError(f"load factor {load_factor} is not in (0, 1]")
        self._slots = memory // BYTES_PER_ENTRY
        # Kafka: "offset map is too small to fit in even a single message"
        if self._slots * load_factor <= 1:
            raise OffsetMapConfigError(
                f"an offset map of {memory} bytes holds no entry: raise "
                "log.cleaner.dedupe.buffer.size"
            )
        self.capacity = int(self._slots * load_factor)  # Kafka's maxDesiredMapSize
        self._table = bytearray(self._slots * BYTES_PER_ENTRY)
        self.entries = 0
        self.latest_offset = -1
        self.lookups = 0
        self.probes = 0

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def memory(self) -> int:
        """Bytes the table occupies."""
        return len(self._table)

    @property
    def is_full(self) -> bool:
        """Filled to the load factor: building the map must stop (Kafka checks before each
        put, even of a key already in the map)."""
        return self.entries >= self.capacity

    def _position(self, digest: bytes, attempt: int) -> int:
        # Kafka's positionOf: a 4-byte window of the hash per attempt, then one slot further
        window = min(attempt, HASH_SIZE - 4)
        probe = _WINDOW.unpack_from(digest, window)[0] + max(0, attempt - HASH_SIZE + 4)
        # Kafka's Utils.abs on an int: wraps like Java's int arithmetic
        probe = (probe - _INT32_MIN) % (1 << 32) + _INT32_MIN
        return (probe & 0x7FFFFFFF) % self._slots * BYTES_PER_ENTRY

    def put(self, key: bytes | bytearray | memoryview, offset: int) -> None:
        """Map `key` to `offset` (a later put of the same key replaces it).

        The caller stops at `is_full` (Kafka's buildOffsetMap does); a put into a table with no
        free slot left is a bug and raises, as Kafka's does.
        """
        if self.entries >= self._slots:
            raise OffsetMapConfigError(f"the offset map is full ({self.entries} entries)")
        digest = hashlib.md5(key, usedforsecurity=False).digest()
        table = self._table
        self.lookups += 1
        attempt = 0
        while True:
            pos = self._position(digest, attempt)
            self.probes += 1
            if table[pos : pos + BYTES_PER_ENTRY] == _EMPTY_SLOT:
                table[pos : pos + HASH_SIZE] = digest
                self.entries += 1
                break
            if table[pos : pos + HASH_SIZE] == digest:
                break
            attempt += 1
        _OFFSET.pack_into(table, pos + HASH_SIZE, offset)
        self.latest_offset = offset  # offsets are put in increasing order

    def get(self, key: bytes | bytearray | memoryview) -> int:
        """The latest offset mapped for `key`, or -1."""
        digest = hashlib.md5(key, usedforsecurity=False).digest()
        table = self._table
        self.lookups += 1
        for attempt in range(self._slots + HASH_SIZE - 4):
            pos = self._position(digest, attempt)
            self.probes += 1
            if table[pos : pos + HASH_SIZE] == digest:
                return _OFFSET.unpack_from(table, pos + HASH_SIZE)[0]
            if table[pos : pos + BYTES_PER_ENTRY] == _EMPTY_SLOT:
                return -1
        return -1

    def update_latest_offset(self, offset: int) -> None:
        """Record that the map covers the log up to `offset` (gaps, keyless and aborted
        batches, control batches)."""
        self.latest_offset = offset

    def clear(self) -> None:
        if self.entries:
            self._table[:] = bytes(len(self._table))
        self.entries = 0
        self.latest_offset = -1
        self.lookups = 0
        self.probes = 0

    def __len__(self) -> int:
        return self.entries
