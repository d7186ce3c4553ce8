"""Producer-state snapshots: round trips, restore + replay, corruption detection."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.txn.producer_log import T0, Partition, assert_restore_and_replay_match, data, state_of

from onceflow.log.producer_entry import BatchMetadata, ProducerStateEntry
from onceflow.log.producer_errors import CorruptSnapshotError
from onceflow.log.producer_snapshot import (
    decode_snapshot,
    encode_snapshot,
    snapshot_file_name,
)
from onceflow.log.producer_state import DuplicateBatch, ProducerStateManager


def _busy_partition() -> Partition:
    part = Partition()
    for i in range(7):
        part.produce(data(1, 0, 3 * i, 3))
    part.produce(data(2, 4, 0, 2, txn=True))
    part.produce(data(3, 1, 10, 1, txn=True))
    part.clock.advance(3)
    part.marker(3, 1, commit=False, coordinator_epoch=7)
    part.produce(data(2, 4, 2, 1, txn=True))
    part.produce(data(-1, -1, -1, 4))
    return part


def test_round_trip_keeps_every_cached_batch() -> None:
    part = _busy_partition()
    restored = ProducerStateManager.from_snapshot(part.psm.snapshot(), part.clock)
    assert state_of(restored) == state_of(part.psm)
    assert len(restored.batch_metadata(1)) == 5
    # a retry of any of the last five batches still gets its original offsets after a restart
    for i in range(2, 7):
        dup = restored.check_append(data(1, 0, 3 * i, 3))
        assert dup == DuplicateBatch(3 * i, 3 * i + 2, T0)


def test_restore_then_replay_of_the_rest_equals_a_full_replay() -> None:
    part = _busy_partition()
    middle = len(part.log)
    snap = part.psm.snapshot()
    part.produce(data(2, 4, 3, 2, txn=True))
    part.marker(2, 5, commit=False, coordinator_epoch=8)
    part.produce(data(1, 1, 0, 1))
    restored = ProducerStateManager.from_snapshot(snap, part.clock)
    assert restored.map_end_offset == part.log[middle][0].base_offset
    assert_restore_and_replay_match(snap, part.log, middle, part.psm, part.clock)


def test_expired_producers_are_not_loaded() -> None:
    part = Partition(expiration_ms=1000)
    part.produce(data(1, 0, 0))
    part.produce(data(2, 0, 0, txn=True))
    snap = part.psm.snapshot()
    part.clock.advance(5000)
    restored = ProducerStateManager.from_snapshot(snap, part.clock, producer_id_expiration_ms=1000)
    assert [p.producer_id for p in restored.producers()] == [2]  # the open transaction stays
    assert restored.first_undecided_offset() == 1


def test_every_single_byte_change_is_detected() -> None:
    snap = _busy_partition().psm.snapshot()
    for i in range(len(snap)):
        corrupt = bytearray(snap)
        corrupt[i] ^= 0x01
        with pytest.raises(CorruptSnapshotError):
            decode_snapshot(bytes(corrupt))


def test_every_truncation_is_detected() -> None:
    snap = _busy_partition().psm.snapshot()
    for end in range(len(snap)):
        with pytest.raises(CorruptSnapshotError):
            ProducerStateManager.from_snapshot(snap[:end], lambda: T0)
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(snap + b"\0")


def test_unknown_version_is_corrupt() -> None:
    snap = bytearray(encode_snapshot(0, []))
    struct.pack_into(">h", snap, 0, 3)
    with pytest.raises(CorruptSnapshotError, match="version"):
        decode_snapshot(bytes(snap))


def test_a_version_1_snapshot_is_read_without_crcs() -> None:
    """Snapshots written before the CRCs were kept still load: their batches' CRCs are unknown,
    so a retry of one is a duplicate whatever its CRC (Kafka's rule)."""
    batch = struct.pack(">iqiq", 4, 10, 4, T0)
    entry = struct.pack(">qhiqqqb", 7, 2, 0, T0, -1, -1, 1)
    body = struct.pack(">qi", 11, 1) + entry + batch
    decoded = decode_snapshot(struct.pack(">hI", 1, crc32c(body)) + body)
    assert decoded.entries[0].batches == (BatchMetadata(4, 10, 4, T0, None),)


def test_two_transactions_at_one_offset_are_corrupt() -> None:
    entries = [ProducerStateEntry(pid, 0, 0, T0, 5, T0) for pid in (1, 2)]
    with pytest.raises(CorruptSnapshotError):
        ProducerStateManager.from_snapshot(encode_snapshot(9, entries), lambda: T0)


def test_snapshot_file_name_is_kafkas() -> None:
    assert snapshot_file_name(1234) == "00000000000000001234.snapshot"


_batches = st.lists(
    st.builds(
        BatchMetadata,
        st.integers(-1, 2**31 - 1),
        st.integers(0, 2**62),
        st.integers(0, 2**20),
        st.integers(-1, 2**50),
        st.none() | st.integers(0, 2**32 - 1),
    ),
    max_size=5,
)
_entries = st.builds(
    ProducerStateEntry,
    st.integers(0, 2**63 - 1),
    st.integers(-1, 2**15 - 1),
    st.integers(-1, 2**31 - 1),
    st.integers(-1, 2**50),
    st.integers(-1, 2**62),
    st.integers(-1, 2**50),
    _batches,
)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**62), st.lists(_entries, max_size=6, unique_by=lambda e: e.producer_id))
def test_codec_round_trips(map_end_offset: int, entries: list[ProducerStateEntry]) -> None:
    decoded = decode_snapshot(encode_snapshot(map_end_offset, entries))
    assert decoded.map_end_offset == map_end_offset
    assert decoded.entries == entries


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_is_rejected_or_decoded_canonically(garbage: bytes) -> None:
    try:
        decoded = decode_snapshot(garbage)
    except CorruptSnapshotError:
        return
    assert encode_snapshot(decoded.map_end_offset, decoded.entries) == garbage
