"""The ``__transaction_state`` record format and durable producer id allocation."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.txn.coordinator_errors import TransactionLogRecordError
from onceflow.txn.producer_ids import ProducerIdManager
from onceflow.txn.transaction_log import (
    LAST_PRODUCER_EPOCH_TAG,
    PRODUCER_ID_BLOCK_KEY_VERSION,
    ProducerIdBlock,
    ProducerIdBlockKey,
    TransactionLogKey,
    TransactionLogValue,
    decode_key,
    decode_producer_id_block_value,
    decode_value,
    encode_key,
    encode_value,
    producer_id_block_record,
    transaction_record,
)
from onceflow.txn.transaction_state import TransactionState

S = TransactionState

int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
partitions = st.frozensets(st.tuples(st.text(max_size=20), st.integers(0, 2**31 - 1)), max_size=8)


@st.composite
def log_values(draw: st.DrawFn) -> TransactionLogValue:
    state = draw(st.sampled_from([s for s in S if s is not S.DEAD]))
    return TransactionLogValue(
        producer_id=draw(int64),
        producer_epoch=draw(int16),
        txn_timeout_ms=draw(int32),
        state=state,
        partitions=frozenset() if state is S.EMPTY else draw(partitions),
        txn_last_update_timestamp=draw(int64),
        txn_start_timestamp=draw(int64),
        previous_producer_id=draw(int64),
        last_producer_epoch=draw(int16),
    )


@given(st.text(max_size=200))
def test_key_round_trip(transactional_id: str) -> None:
    assert decode_key(encode_key(transactional_id)) == TransactionLogKey(transactional_id)


@given(log_values())
def test_value_round_trip(value: TransactionLogValue) -> None:
    assert decode_value(encode_value(value)) == value


@given(st.text(max_size=50), st.one_of(st.none(), log_values()))
def test_record_round_trip(transactional_id: str, value: TransactionLogValue | None) -> None:
    key, raw = transaction_record(transactional_id, value)
    assert decode_key(key) == TransactionLogKey(transactional_id)
    assert (None if raw is None else decode_value(raw)) == value


@given(st.integers(0, 2**62), st.integers(1, 2**31 - 1))
def test_producer_id_block_round_trip(first: int, size: int) -> None:
    key, value = producer_id_block_record(ProducerIdBlock(first, size))
    assert decode_key(key) == ProducerIdBlockKey()
    assert decode_producer_id_block_value(value) == ProducerIdBlock(first, size)


def test_key_bytes_are_kafkas_transaction_log_key_v0() -> None:
    assert encode_key("t1") == b"\x00\x00" + b"\x00\x02t1"


def test_value_bytes_are_kafkas_transaction_log_value_v1() -> None:
    value = TransactionLogValue(
        producer_id=1,
        producer_epoch=2,
        txn_timeout_ms=3,
        state=S.ONGOING,
        partitions=frozenset({("t", 0), ("t", 5)}),
        txn_last_update_timestamp=4,
        txn_start_timestamp=5,
    )
    expected = (
        b"\x00\x01"  # version 1 (flexible)
        + struct.pack(">qhib", 1, 2, 3, 1)
        + b"\x02"  # one topic (compact array: n + 1)
        + b"\x02t"  # compact string
        + b"\x03"
        + struct.pack(">ii", 0, 5)
        + b"\x00"  # topic entry tagged fields
        + struct.pack(">qq", 4, 5)
        + b"\x00"  # no tagged fields
    )
    assert encode_value(value) == expected


def test_empty_is_written_with_null_partitions_and_tags_when_set() -> None:
    value = TransactionLogValue(9, 1, 100, S.EMPTY, frozenset(), 7, -1, 8, 0)
    raw = encode_value(value)
    assert raw[2 + 8 + 2 + 4 + 1] == 0  # null partitions
    tags = raw[2 + 8 + 2 + 4 + 1 + 1 + 16 :]
    assert tags[0] == 2  # previous producer id and last epoch
    assert tags[1:3] == b"\x00\x08" and tags[3:11] == struct.pack(">q", 8)
    assert decode_value(raw) == value


def test_decodes_kafka_value_v0() -> None:
    raw = (
        b"\x00\x00"
        + struct.pack(">qhib", 42, 3, 60000, S.PREPARE_COMMIT)
        + struct.pack(">i", 1)
        + b"\x00\x05topic"
        + struct.pack(">iii", 2, 0, 1)
        + struct.pack(">qq", 1000, 900)
    )
    assert decode_value(raw) == TransactionLogValue(
        42, 3, 60000, S.PREPARE_COMMIT, frozenset({("topic", 0), ("topic", 1)}), 1000, 900
    )


def test_unknown_tagged_fields_are_skipped() -> None:
    value = TransactionLogValue(1, 2, 3, S.ONGOING, frozenset({("t", 0)}), 4, 5)
    raw = encode_value(value)
    # Replace "no tagged fields" by a tag Kafka may add later (5).
    tagged = b"\x01" + b"\x05\x08" + struct.pack(">q", 77)
    assert decode_value(raw[:-1] + tagged) == value


def test_kafkas_version_2_tags_are_read_and_written() -> None:
    """NextProducerId (tag 1) and ClientTransactionVersion (tag 2), as Kafka 4 writes them."""
    value = TransactionLogValue(1, 2, 3, S.ONGOING, frozenset({("t", 0)}), 4, 5)
    raw = encode_value(value)
    tagged = b"\x02" + b"\x01\x08" + struct.pack(">q", 77) + b"\x02\x02" + struct.pack(">h", 2)
    decoded = decode_value(raw[:-1] + tagged)
    assert (decoded.next_producer_id, decoded.client_transaction_version) == (77, 2)
    assert encode_value(decoded) == raw[:-1] + tagged


def test_kafkas_next_producer_epoch_tag_loads_and_is_not_written() -> None:
    """Kafka 4.4's TransactionLogValue has NextProducerEpoch (tag 3, for KIP-939's prepared
    transactions) but its coordinator neither writes nor reads it: a record carrying it loads
    as without it, onceflow writes no tag 3 and its own tag is not 3."""
    value = TransactionLogValue(1, 2, 3, S.ONGOING, frozenset({("t", 0)}), 4, 5)
    raw = encode_value(value)
    tagged = b"\x01" + b"\x03\x02" + struct.pack(">h", 9)
    assert decode_value(raw[:-1] + tagged) == value
    assert encode_value(decode_value(raw[:-1] + tagged)) == raw
    assert LAST_PRODUCER_EPOCH_TAG > 3


def test_last_producer_epoch_tag_is_outside_kafkas_tags() -> None:
    assert LAST_PRODUCER_EPOCH_TAG > 2
    assert PRODUCER_ID_BLOCK_KEY_VERSION > 0


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x00",
        b"\x00\x05" + bytes(40),  # unknown version
        encode_value(TransactionLogValue(1, 2, 3, S.ONGOING, frozenset({("t", 0)}), 4, 5))[:-3],
        encode_value(TransactionLogValue(1, 2, 3, S.ONGOING, frozenset({("t", 0)}), 4, 5)) + b"x",
        b"\x00\x01" + struct.pack(">qhib", 1, 2, 3, 9) + b"\x00" + bytes(17),  # state 9
        b"\x00\x01" + struct.pack(">qhib", 1, 2, 3, 1) + b"\x02\x02\xff" + bytes(30),  # bad UTF-8
    ],
)
def test_corrupt_values_raise(raw: bytes) -> None:
    with pytest.raises(TransactionLogRecordError):
        decode_value(raw)


@pytest.mark.parametrize(
    "raw", [b"", b"\x00\x07\x00\x00", b"\x00\x00\x00\x05ab", encode_key("a") + b"z"]
)
def test_corrupt_keys_raise(raw: bytes) -> None:
    with pytest.raises(TransactionLogRecordError):
        decode_key(raw)


def test_dead_and_empty_with_partitions_cannot_be_encoded() -> None:
    with pytest.raises(TransactionLogRecordError):
        encode_value(TransactionLogValue(1, 2, 3, S.DEAD, frozenset(), 4, 5))
    with pytest.raises(TransactionLogRecordError):
        encode_value(TransactionLogValue(1, 2, 3, S.EMPTY, frozenset({("t", 0)}), 4, 5))


@given(st.binary(max_size=80))
def test_decoding_garbage_never_raises_anything_else(raw: bytes) -> None:
    for decode in (decode_key, decode_value, decode_producer_id_block_value):
        with contextlib.suppress(TransactionLogRecordError):
            decode(raw)


# -- producer ids ---------------------------------------------------------------------------


def test_ids_come_from_blocks_whose_record_travels_until_durable() -> None:
    manager = ProducerIdManager(block_size=3)
    pid0, records0 = manager.allocate()
    pid1, records1 = manager.allocate()
    assert (pid0, pid1) == (0, 1)
    assert records0 == records1 == [producer_id_block_record(ProducerIdBlock(0, 3))]
    manager.replay(ProducerIdBlock(0, 3))
    assert manager.allocate() == (2, [])
    pid3, records3 = manager.allocate()
    assert pid3 == 3 and records3 == [producer_id_block_record(ProducerIdBlock(3, 3))]


def test_restart_starts_after_the_highest_durable_block() -> None:
    manager = ProducerIdManager(block_size=10)
    manager.allocate()
    manager.replay(ProducerIdBlock(0, 10))
    restarted = ProducerIdManager(block_size=10)
    restarted.replay(ProducerIdBlock(0, 10))
    pid, records = restarted.allocate()
    assert pid == 10 and records == [producer_id_block_record(ProducerIdBlock(10, 10))]


@given(st.lists(st.sampled_from(["allocate", "persist", "restart"]), max_size=60))
def test_no_producer_id_is_ever_handed_out_twice(ops: list[str]) -> None:
    """An id counts as handed out once its records are durable; restarts lose the rest."""
    durable: list[ProducerIdBlock] = []
    manager = ProducerIdManager(block_size=2)
    unanswered: list[tuple[int, list[tuple[bytes, bytes | None]]]] = []
    answered: set[int] = set()
    for op in ops:
        if op == "allocate":
            unanswered.append(manager.allocate())
        elif op == "persist" and unanswered:
            pid, records = unanswered.pop(0)
            for _key, value in records:
                assert value is not None
                block = decode_producer_id_block_value(value)
                durable.append(block)
                manager.replay(block)
            assert pid < manager.durable_end
            assert pid not in answered
            answered.add(pid)
        elif op == "restart":
            manager = ProducerIdManager(block_size=2)
            for block in durable:
                manager.replay(block)
            unanswered.clear()
