"""Committed offsets and pending transactional offsets, changed only by replaying records.

The store is the in-memory image of the ``__consumer_offsets`` log: every change comes from
:meth:`OffsetStore.replay_commit` (an OffsetCommit record or its tombstone) or
:meth:`OffsetStore.replay_end_transaction` (a transaction marker on the offsets log). Loading
after a restart is the same replay, so the image after a restart equals the image before it.

Offsets committed inside a transaction (TxnOffsetCommit) are held per producer id until the
marker: COMMIT moves them into the committed offsets, ABORT drops them (KIP-98, KIP-447).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

TopicPartition = tuple[str, int]

INVALID_OFFSET = -1
NO_LEADER_EPOCH = -1


@dataclass(frozen=True)
class OffsetAndMetadata:
    """One committed offset, as a client sends it and as the offsets log stores it."""

    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str = ""
    commit_timestamp_ms: int = -1
    # Only OffsetCommit v2-v4 with an explicit retention time set it (value record v1).
    expire_timestamp_ms: int | None = None


@dataclass(frozen=True)
class OffsetFetchEntry:
    """One partition of an OffsetFetch answer; offset -1 when nothing is committed."""

    offset: int = INVALID_OFFSET
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str = ""
    error: ErrorCode = ErrorCode.none


@dataclass(frozen=True)
class _Stored:
    value: OffsetAndMetadata
    # Position of the record in replay order (= log order); decides which of a transactional
    # and a plain commit of the same partition is the newer one when a transaction commits.
    record_seq: int


class OffsetStore:
    """Committed offsets per group and pending transactional offsets per producer id."""

    def __init__(self) -> None:
        self._committed: dict[str, dict[TopicPartition, _Stored]] = {}
        self._pending: dict[int, dict[str, dict[TopicPartition, _Stored]]] = {}
        self._open_txns_by_group: dict[str, set[int]] = {}
        self._seq = 0

    # -- replay -------------------------------------------------------------------------

    def replay_commit(
        self,
        group_id: str,
        tp: TopicPartition,
        value: OffsetAndMetadata | None,
        producer_id: int = -1,
        transactional: bool = False,
    ) -> None:
        """Apply one OffsetCommit record (``value`` None is a tombstone)."""
        self._seq += 1
        if value is not None:
            stored = _Stored(value, self._seq)
            if transactional:
                self._pending.setdefault(producer_id, {}).setdefault(group_id, {})[tp] = stored
                self._open_txns_by_group.setdefault(group_id, set()).add(producer_id)
            else:
                self._committed.setdefault(group_id, {})[tp] = stored
            return
        # A tombstone removes the committed offset and any pending transactional one, as Kafka.
        self._remove(self._committed, group_id, tp)
        for pid in self._open_txns_by_group.get(group_id, ()):
            pending = self._pending.get(pid)
            if pending is not None:
                self._remove(pending, group_id, tp)

    def replay_end_transaction(self, producer_id: int, committed: bool) -> None:
        """Apply a COMMIT or ABORT marker written to the offsets log for ``producer_id``."""
        pending = self._pending.pop(producer_id, None)
        if pending is None:
            return
        for group_id in pending:
            open_txns = self._open_txns_by_group.get(group_id)
            if open_txns is not None:
                open_txns.discard(producer_id)
                if not open_txns:
                    del self._open_txns_by_group[group_id]
        if not committed:
            return
        for group_id, offsets in pending.items():
            group = self._committed.setdefault(group_id, {})
            for tp, stored in offsets.items():
                current = group.get(tp)
                # Keep whichever was written last: a plain commit after the transactional one wins.
                if current is None or stored.record_seq > current.record_seq:
                    group[tp] = stored
            if not group:
                del self._committed[group_id]

    # -- queries ------------------------------------------------------------------------

    def get(self, group_id: str, tp: TopicPartition) -> OffsetAndMetadata | None:
        stored = self._committed.get(group_id, {}).get(tp)
        return None if stored is None else stored.value

    def committed(self, group_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
        return {tp: s.value for tp, s in self._committed.get(group_id, {}).items()}

    def has_pending(self, group_id: str, tp: TopicPartition) -> bool:
        for pid in self._open_txns_by_group.get(group_id, ()):
            if tp in self._pending.get(pid, {}).get(group_id, {}):
                return True
        return False

    def pending_partitions(self, group_id: str) -> set[TopicPartition]:
        found: set[TopicPartition] = set()
        for pid in self._open_txns_by_group.get(group_id, ()):
            found.update(self._pending.get(pid, {}).get(group_id, {}))
        return found

    def pending_for_producer(self, producer_id: int) -> dict[str, dict[TopicPartition, int]]:
        """Pending offsets of one producer id: group -> partition -> offset (for inspection)."""
        return {
            group_id: {tp: s.value.offset for tp, s in offsets.items()}
            for group_id, offsets in self._pending.get(producer_id, {}).items()
        }

    def has_open_transactions(self, group_id: str) -> bool:
        return bool(self._open_txns_by_group.get(group_id))

    def groups(self) -> Iterator[str]:
        yield from self._committed

    def snapshot(self) -> dict[str, dict[TopicPartition, OffsetAndMetadata]]:
        """All committed offsets (a copy), for comparisons in tests and tooling."""
        return {g: self.committed(g) for g in self._committed}

    @staticmethod
    def _remove(
        table: dict[str, dict[TopicPartition, _Stored]], group_id: str, tp: TopicPartition
    ) -> None:
        offsets = table.get(group_id)
        if offsets is None:
            return
        offsets.pop(tp, None)
        if not offsets:
            del table[group_id]
