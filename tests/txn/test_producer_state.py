"""Focused tests of ProducerStateManager: one rule or one error each."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode
from tests.txn.producer_log import T0, Partition, data, marker_header, state_of

from onceflow.log.producer_errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from onceflow.log.producer_state import (
    AppendOrigin,
    CompletedTxn,
    DuplicateBatch,
    OpenTxn,
    ProducerEntry,
    ProducerStateManager,
)
from onceflow.records.batch import (
    CONTROL_FLAG,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG,
)

INT32_MAX = (1 << 31) - 1


@pytest.fixture
def part() -> Partition:
    return Partition()


# -- plain and idempotent producers ------------------------------------------------------------


def test_plain_batches_are_not_checked(part: Partition) -> None:
    assert part.produce(data(-1, -1, -1)) == (0, 0)
    assert part.produce(data(-1, -1, -1, 3)) == (1, 3)
    assert part.psm.producers() == []
    assert part.psm.map_end_offset == 4


def test_unknown_producer_may_start_at_any_sequence(part: Partition) -> None:
    """KIP-360: brokers no longer answer UNKNOWN_PRODUCER_ID."""
    assert part.produce(data(7, 3, 42, 2)) == (0, 1)
    assert part.psm.producer(7) == ProducerEntry(7, 3, 43, T0, -1, -1)


def test_in_order_sequences_are_accepted(part: Partition) -> None:
    assert part.produce(data(1, 0, 0, 3)) == (0, 2)
    assert part.produce(data(1, 0, 3, 2)) == (3, 4)
    assert part.psm.producer(1).last_sequence == 4  # type: ignore[union-attr]


def test_sequence_gap_is_out_of_order(part: Partition) -> None:
    part.produce(data(1, 0, 0, 3))
    with pytest.raises(OutOfOrderSequenceError) as info:
        part.psm.check_append(data(1, 0, 4))
    assert info.value.error_code == ErrorCode.out_of_order_sequence_number
    assert part.psm.producer(1).last_sequence == 2  # type: ignore[union-attr]


def test_retries_of_the_last_five_batches_are_duplicates(part: Partition) -> None:
    offsets = []
    for i in range(7):
        part.clock.advance(10)
        offsets.append(part.produce(data(1, 0, 2 * i, 2, ts=part.clock())))
    before = part.psm.snapshot()
    for i in range(2, 7):
        dup = part.produce(data(1, 0, 2 * i, 2))
        assert dup == DuplicateBatch(*offsets[i], log_append_time=T0 + 10 * (i + 1))
    assert part.psm.snapshot() == before  # a duplicate changes nothing
    assert part.end == 14
    # older than the five cached batches: not a duplicate any more, but out of order
    with pytest.raises(OutOfOrderSequenceError):
        part.psm.check_append(data(1, 0, 2, 2))


def test_a_duplicate_needs_the_exact_sequence_range(part: Partition) -> None:
    part.produce(data(1, 0, 0, 3))
    part.produce(data(1, 0, 3, 3))
    with pytest.raises(OutOfOrderSequenceError):
        part.psm.check_append(data(1, 0, 3, 2))  # same first sequence, other last sequence


def test_reused_sequences_for_other_records_are_out_of_order(part: Partition) -> None:
    """librdkafka's abort_transaction() can number new records with the sequences of records
    it purged after sending them: a duplicate by sequence with another CRC is refused, not
    acknowledged with the offsets of the records it does not hold (Kafka would)."""
    assert part.produce(data(1, 0, 0, 3, txn=True, crc=111)) == (0, 2)
    part.marker(1, 0, commit=False)
    before = part.psm.snapshot()
    with pytest.raises(OutOfOrderSequenceError, match=r"reused sequences 0\.\.2"):
        part.psm.check_append(data(1, 0, 0, 3, txn=True, crc=222))
    assert part.psm.snapshot() == before
    # the real retry still gets its original offsets
    assert part.produce(data(1, 0, 0, 3, txn=True, crc=111)) == DuplicateBatch(0, 2, T0)


def test_a_log_append_time_batch_is_deduplicated_by_sequence_alone(part: Partition) -> None:
    """The broker rewrites a LogAppendTime batch's CRC, so its cached CRC is not the one the
    producer sent: only the sequences can tell its retry (Kafka's rule)."""
    appended = data(1, 0, 0, 2, crc=999, attributes=TIMESTAMP_TYPE_MASK)  # as the log holds it
    part.psm.on_append(appended)
    assert part.psm.batch_metadata(1)[0].crc is None
    assert part.psm.check_append(data(1, 0, 0, 2, crc=5)) == DuplicateBatch(0, 1, T0)


def test_lower_epoch_is_invalid_producer_epoch(part: Partition) -> None:
    part.produce(data(1, 5, 0))
    with pytest.raises(InvalidProducerEpochError) as info:
        part.psm.check_append(data(1, 4, 1))
    assert info.value.error_code == ErrorCode.invalid_producer_epoch
    with pytest.raises(InvalidProducerEpochError):
        part.psm.check_append(data(1, 4, 0, txn=True))


def test_retry_from_an_older_epoch_is_fenced_not_a_duplicate(part: Partition) -> None:
    part.produce(data(1, 0, 0))
    part.produce(data(1, 1, 0))  # the cache now holds epoch 1 only
    assert part.psm.batch_metadata(1)[0].last_offset == 1
    with pytest.raises(InvalidProducerEpochError):
        part.psm.check_append(data(1, 0, 0))


def test_local_epoch_bump_restarts_at_sequence_zero(part: Partition) -> None:
    """A plain idempotent Java producer bumps its epoch itself and restarts at 0."""
    part.produce(data(1, 0, 0, 5))
    assert part.produce(data(1, 1, 0, 2)) == (5, 6)
    assert [b.last_sequence for b in part.psm.batch_metadata(1)] == [1]


def test_new_epoch_must_start_at_zero(part: Partition) -> None:
    part.produce(data(1, 0, 0, 5))
    with pytest.raises(OutOfOrderSequenceError):
        part.psm.check_append(data(1, 1, 5))


def test_sequence_wraps_at_int32_max(part: Partition) -> None:
    part.produce(data(1, 0, INT32_MAX - 1, 2))  # last sequence Int32.MAX
    assert part.produce(data(1, 0, 0, 3)) == (2, 4)
    part.produce(data(1, 0, 3, 1))
    # a batch crossing the wrap: MAX - 1, MAX, 0
    other = Partition()
    other.produce(data(2, 0, INT32_MAX - 1, 3))
    assert other.psm.producer(2).last_sequence == 0  # type: ignore[union-attr]
    assert other.produce(data(2, 0, INT32_MAX - 1, 3)) == DuplicateBatch(0, 2, T0)
    with pytest.raises(OutOfOrderSequenceError):
        other.psm.check_append(data(2, 0, INT32_MAX))
    assert other.produce(data(2, 0, 1)) == (3, 3)


def test_control_batches_are_not_data(part: Partition) -> None:
    header = data(1, 0, -1)
    from dataclasses import replace

    control = replace(header, attributes=TRANSACTIONAL_FLAG | CONTROL_FLAG)
    with pytest.raises(ValueError):
        part.psm.check_append(control)
    with pytest.raises(ValueError):
        part.psm.on_append(control)


# -- transactions ---------------------------------------------------------------------------


def test_transaction_opens_at_its_first_offset_and_holds_the_lso(part: Partition) -> None:
    part.produce(data(1, 0, 0, 2))
    part.produce(data(2, 0, 0, 3, txn=True))
    part.produce(data(2, 0, 3, 1, txn=True))
    part.produce(data(1, 0, 2))
    assert part.psm.first_unstable_offset() == 2
    assert part.psm.last_stable_offset(part.end) == 2
    assert part.psm.last_stable_offset(1) == 1  # never past the high watermark
    assert part.psm.open_transactions() == [OpenTxn(2, 0, 2, T0, T0)]
    assert part.psm.producer(2).current_txn_start_offset == 2  # type: ignore[union-attr]
    completed = part.marker(2, 0, commit=True)
    assert completed == CompletedTxn(2, 2, 7, is_aborted=False, last_stable_offset=8)
    assert part.psm.open_transactions() == []
    assert part.psm.last_stable_offset(part.end) == part.end == 8


def test_non_transactional_batch_during_a_transaction_is_invalid_txn_state(
    part: Partition,
) -> None:
    part.produce(data(1, 0, 0, txn=True))
    with pytest.raises(InvalidTxnStateError) as info:
        part.psm.check_append(data(1, 0, 1))
    assert info.value.error_code == ErrorCode.invalid_txn_state
    part.marker(1, 0, commit=False)
    assert part.produce(data(1, 0, 1)) == (2, 2)  # closed: plain idempotent writes again


def test_abort_records_the_lso_of_other_open_transactions(part: Partition) -> None:
    part.produce(data(1, 0, 0, 2, txn=True))  # 0-1
    part.produce(data(2, 0, 0, 2, txn=True))  # 2-3
    part.produce(data(1, 0, 2, 1, txn=True))  # 4
    aborted = part.marker(1, 0, commit=False)  # 5
    assert aborted == CompletedTxn(1, 0, 5, is_aborted=True, last_stable_offset=2)
    assert part.psm.last_stable_offset(part.end) == 2
    committed = part.marker(2, 0, commit=True)  # 6
    assert committed == CompletedTxn(2, 2, 6, is_aborted=False, last_stable_offset=7)
    assert part.psm.last_stable_offset(part.end) == 7


def test_marker_without_open_transaction_returns_none(part: Partition) -> None:
    assert part.marker(9, 0, commit=True) is None
    part.produce(data(1, 0, 0))
    assert part.marker(1, 0, commit=False) is None
    assert part.psm.producer(9) == ProducerEntry(9, 0, -1, T0, 0, -1)


def test_marker_with_lower_epoch_is_rejected(part: Partition) -> None:
    part.produce(data(1, 3, 0, txn=True))
    with pytest.raises(InvalidProducerEpochError):
        part.psm.check_marker(1, 2, 0)
    with pytest.raises(InvalidProducerEpochError):
        part.psm.on_marker(marker_header(5, 1, 2, T0), False, 0)
    assert part.psm.open_transactions()[0].first_offset == 0  # nothing changed


def test_fencing_marker_with_bumped_epoch_closes_and_clears_the_cache(part: Partition) -> None:
    part.produce(data(1, 0, 0, 2, txn=True))
    completed = part.marker(1, 1, commit=False)  # the coordinator fenced epoch 0
    assert completed is not None and completed.is_aborted
    assert part.psm.batch_metadata(1) == ()
    with pytest.raises(InvalidProducerEpochError):
        part.psm.check_append(data(1, 0, 2, txn=True))  # the zombie
    with pytest.raises(OutOfOrderSequenceError):
        part.psm.check_append(data(1, 1, 2, txn=True))
    assert part.produce(data(1, 1, 0, txn=True)) == (3, 3)


def test_marker_from_an_older_coordinator_epoch_is_fenced(part: Partition) -> None:
    part.produce(data(1, 0, 0, txn=True))
    part.marker(1, 0, commit=True, coordinator_epoch=4)
    part.produce(data(1, 0, 1, txn=True))
    with pytest.raises(TransactionCoordinatorFencedError) as info:
        part.psm.check_marker(1, 0, 3)
    assert info.value.error_code == ErrorCode.transaction_coordinator_fenced
    assert part.marker(1, 0, commit=True, coordinator_epoch=5) is not None
    assert part.psm.producer(1).coordinator_epoch == 5  # type: ignore[union-attr]


def test_transaction_version_2_markers_must_bump_the_epoch(part: Partition) -> None:
    part.produce(data(1, 0, 0, txn=True))
    with pytest.raises(InvalidProducerEpochError):
        part.psm.check_marker(1, 0, 0, transaction_version=2)
    assert part.marker(1, 1, commit=True, transaction_version=2) is not None
    # a retry of that marker is accepted and closes nothing
    assert part.marker(1, 1, commit=True, transaction_version=2) is None


def test_verification_is_needed_only_to_open_a_transaction(part: Partition) -> None:
    first = data(1, 0, 0, txn=True)
    assert part.psm.needs_verification(first)
    with pytest.raises(InvalidTxnStateError):
        part.psm.check_append(first, transaction_verified=False)
    part.produce(first, transaction_verified=True)
    following = data(1, 0, 1, txn=True)
    assert not part.psm.needs_verification(following)
    assert part.produce(following, transaction_verified=False) == (1, 1)
    assert not part.psm.needs_verification(data(1, 0, 2))  # idempotent only


def test_stale_epoch_wins_over_failed_verification(part: Partition) -> None:
    part.produce(data(1, 2, 0))
    with pytest.raises(InvalidProducerEpochError):
        part.psm.check_append(data(1, 1, 0, txn=True), transaction_verified=False)


def test_coordinator_origin_checks_epochs_not_sequences(part: Partition) -> None:
    """The group coordinator's transactional offset commits carry no sequence."""
    coord = AppendOrigin.COORDINATOR
    assert part.produce(data(1, 2, -1, txn=True), origin=coord) == (0, 0)
    assert part.produce(data(1, 2, -1, txn=True), origin=coord) == (1, 1)  # no duplicate check
    assert part.psm.open_transactions()[0].first_offset == 0
    with pytest.raises(InvalidProducerEpochError):
        part.psm.check_append(data(1, 1, -1, txn=True), origin=coord)


def test_lso_waits_for_the_marker_to_reach_the_high_watermark(part: Partition) -> None:
    part.produce(data(1, 0, 0, 3, txn=True))  # 0-2
    part.marker(1, 0, commit=True)  # 3
    assert part.psm.first_undecided_offset() is None
    assert part.psm.first_unstable_offset() == 0  # the marker is not durable yet
    assert part.psm.last_stable_offset(3) == 0
    assert part.psm.last_stable_offset(4) == 4
    assert part.psm.first_unstable_offset() == 0  # a read changes nothing ...
    part.psm.on_high_watermark(4)  # ... the partition applies a high watermark that moved
    assert part.psm.first_unstable_offset() is None
    assert part.psm.last_stable_offset(4) == 4


# -- replay, expiration, inspection ---------------------------------------------------------


def test_replay_rebuilds_the_same_state(part: Partition) -> None:
    part.produce(data(-1, -1, -1, 2))
    part.produce(data(1, 0, 0, 3, txn=True))
    part.produce(data(2, 0, 0, 1))
    part.clock.advance(5)
    part.marker(1, 0, commit=False, coordinator_epoch=2)
    part.produce(data(1, 0, 3, 2, txn=True, ts=part.clock()))
    part.produce(data(2, 1, 0, 1))
    replayed = ProducerStateManager(part.clock)
    completed = [replayed.replay(h, c) for h, c in part.log]
    assert state_of(replayed) == state_of(part.psm)
    assert completed[3] == CompletedTxn(1, 2, 6, is_aborted=True, last_stable_offset=7)


def test_a_marker_ends_the_transaction_at_its_own_timestamp_live_and_in_replay(
    part: Partition,
) -> None:
    """The producer's last timestamp is the marker batch's, not the clock when it is applied:
    recovery reads only the batch, so the live state would otherwise differ from a replay."""
    part.produce(data(1, 0, 0, txn=True))
    header = marker_header(1, 1, 0, T0 + 500)
    part.clock.advance(60_000)  # applied a minute after the marker's timestamp
    part.psm.on_marker(header, True, 0)
    replayed = ProducerStateManager(part.clock)
    replayed.replay(part.log[0][0])
    replayed.replay(header, (True, 0))
    assert part.psm.producers()[0].last_timestamp == T0 + 500
    assert state_of(replayed) == state_of(part.psm)


def test_replay_needs_the_marker_of_a_control_batch(part: Partition) -> None:
    part.produce(data(1, 0, 0, txn=True))
    part.marker(1, 0, commit=True)
    control_header = part.log[-1][0]
    with pytest.raises(ValueError):
        ProducerStateManager(part.clock).replay(control_header)


def test_idle_producers_expire_but_not_with_an_open_transaction() -> None:
    part = Partition(expiration_ms=1000)
    part.produce(data(1, 0, 0))
    part.produce(data(2, 0, 0, txn=True))
    part.clock.advance(999)
    assert part.psm.remove_expired() == []
    part.clock.advance(1)
    assert part.psm.remove_expired() == [1]
    assert [p.producer_id for p in part.psm.producers()] == [2]
    # an expired producer is unknown again: any sequence is accepted
    assert part.produce(data(1, 0, 17)) == (2, 2)
    part.marker(2, 0, commit=True)
    part.clock.advance(1000)
    assert part.psm.remove_expired() == [1, 2]
    assert len(part.psm) == 0


def test_describe_producers(part: Partition) -> None:
    part.produce(data(5, 2, 10, 4, ts=T0 + 1))
    part.produce(data(3, 0, 0, 1, txn=True, ts=T0 + 2))
    assert part.psm.producers() == [
        ProducerEntry(3, 0, 0, T0 + 2, -1, 4),
        ProducerEntry(5, 2, 13, T0 + 1, -1, -1),
    ]
    assert part.psm.producer(99) is None


def test_producer_state_is_bounded_and_the_idlest_producer_goes_first(part: Partition) -> None:
    part.psm.max_producers = 3
    part.produce(data(1, 0, 0, txn=True, ts=T0))  # an open transaction is never forgotten
    part.produce(data(2, 0, 0, ts=T0 + 1))
    part.produce(data(3, 0, 0, ts=T0 + 2))
    part.produce(data(4, 0, 0, ts=T0 + 3))
    assert len(part.psm) == 3
    assert part.psm.producer(2) is None  # idle longest without a transaction
    assert part.psm.producer(1) is not None and part.psm.producer(4) is not None
