"""The response building the handlers share."""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.add_partitions_to_txn.v3 import response as add_partitions_v3
from kio.schema.describe_producers.v0.response import ProducerState
from kio.schema.errors import ErrorCode
from kio.schema.offset_commit.v8 import response as offset_commit_v8

from onceflow.broker.handlers.responses import build_from, by_topic, partition_errors


@dataclass
class _Producer:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int
    unrelated: str = "left out"


def test_build_from_takes_same_named_attributes_and_the_values_given() -> None:
    source = _Producer(7, 1, 41, 1000, 3, -1)
    built = build_from(ProducerState, source, last_sequence=42)
    assert built == ProducerState(
        producer_id=7,
        producer_epoch=1,
        last_sequence=42,
        last_timestamp=1000,
        coordinator_epoch=3,
        current_txn_start_offset=-1,
    )


def test_by_topic_groups_partitions_in_the_order_first_met() -> None:
    part = offset_commit_v8.OffsetCommitResponsePartition
    a0, b0, a1 = (part(partition_index=i, error_code=ErrorCode.none) for i in (0, 0, 1))
    topics = by_topic([("a", a0), ("b", b0), ("a", a1)], offset_commit_v8.OffsetCommitResponseTopic)
    assert [(t.name, t.partitions) for t in topics] == [("a", (a0, a1)), ("b", (b0,))]


def test_partition_errors_names_the_fields_as_the_api_does() -> None:
    errors = {("t", 1): ErrorCode.invalid_txn_state, ("u", 0): ErrorCode.none}
    topics = partition_errors(
        errors,
        add_partitions_v3.AddPartitionsToTxnTopicResult,
        add_partitions_v3.AddPartitionsToTxnPartitionResult,
        partitions="results_by_partition",
        error="partition_error_code",
    )
    assert [
        (t.name, [(p.partition_index, p.partition_error_code) for p in t.results_by_partition])
        for t in topics
    ] == [("t", [(1, ErrorCode.invalid_txn_state)]), ("u", [(0, ErrorCode.none)])]
