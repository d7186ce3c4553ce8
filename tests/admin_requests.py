"""Requests the clients do not expose (InitProducerId and Produce of a producer of our own,
OffsetFetch with require_stable, ListOffsets with both isolation levels, ListTransactions,
DescribeTransactions, DescribeProducers), sent with onceflow's own protocol client."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.end_txn.v1.request import EndTxnRequest
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v1.request import InitProducerIdRequest
from kio.schema.list_offsets.v2.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.list_transactions.v0.request import ListTransactionsRequest
from kio.schema.offset_fetch.v7.request import OffsetFetchRequest, OffsetFetchRequestTopic
from kio.schema.produce.v8.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.types import BrokerId, GroupId, ProducerId, TopicName, TransactionalId
from kio.static.primitive import i16, i32, i32Timedelta

from onceflow.protocol.client import BrokerConnection, parse_address
from onceflow.records.builder import build_batch
from tests.confluent import TP

READ_UNCOMMITTED = 0
READ_COMMITTED = 1
LATEST = -1


def connect(bootstrap: str) -> BrokerConnection:
    """One connection to the broker, versions negotiated; close it (or use `with`)."""
    host, port = parse_address(bootstrap)
    return BrokerConnection.connect(host, port, client_id="tests")


def call(bootstrap: str, request: Any) -> Any:
    """Send one request entity (at its own version) over a fresh connection: its response."""
    with connect(bootstrap) as connection:
        return connection.send(request)


def init_producer_id(
    bootstrap: str, transactional_id: str | None = None, timeout_ms: int = 60_000
) -> tuple[ErrorCode, int, int]:
    """InitProducerId v1 over a raw connection: (error, producer id, epoch)."""
    request = InitProducerIdRequest(
        transactional_id=None if transactional_id is None else TransactionalId(transactional_id),
        transaction_timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=timeout_ms)),
    )
    response = call(bootstrap, request)
    return response.error_code, response.producer_id, response.producer_epoch


def produce_batch(
    bootstrap: str,
    tp: TP,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    values: list[bytes],
    transactional_id: str | None = None,
    timestamp: int | None = None,
) -> tuple[ErrorCode, int]:
    """Produce (v8, acks=all) one batch of the given producer over a raw connection, as a
    client would send it (transactional when `transactional_id` is set): (error, base offset).
    A retry is the same batch: the same values and `timestamp` (the broker checks its CRC).
    """
    # producer state expires by batch timestamps, as Kafka's
    now = int(time.time() * 1000) if timestamp is None else timestamp
    batch = build_batch(
        [(None, v, (), now) for v in values],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        transactional=transactional_id is not None,
    )
    request = ProduceRequest(
        transactional_id=None if transactional_id is None else TransactionalId(transactional_id),
        acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        topic_data=(
            TopicProduceData(
                name=TopicName(tp[0]),
                partition_data=(PartitionProduceData(index=i32(tp[1]), records=batch),),
            ),
        ),
    )
    response = call(bootstrap, request)
    [part] = response.responses[0].partition_responses
    return part.error_code, part.base_offset


def fetch_committed_offset(
    bootstrap: str, group: str, tp: TP, require_stable: bool
) -> tuple[ErrorCode, int]:
    """OffsetFetch v7 for one partition: (partition error, committed offset)."""
    request = OffsetFetchRequest(
        group_id=GroupId(group),
        topics=(OffsetFetchRequestTopic(name=TopicName(tp[0]), partition_indexes=(i32(tp[1]),)),),
        require_stable=require_stable,
    )
    response = call(bootstrap, request)
    assert response.error_code == ErrorCode.none
    [partition] = response.topics[0].partitions
    return partition.error_code, partition.committed_offset


def list_offsets(bootstrap: str, tps: Iterable[TP], isolation_level: int) -> dict[TP, int]:
    """ListOffsets v2 "latest": the high watermark (read_uncommitted) or the last stable
    offset (read_committed)."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in tps:
        by_topic.setdefault(topic, []).append(partition)
    request = ListOffsetsRequest(
        replica_id=BrokerId(-1),
        isolation_level=isolation_level,
        topics=tuple(
            ListOffsetsTopic(
                name=TopicName(topic),
                partitions=tuple(
                    ListOffsetsPartition(partition_index=i32(p), timestamp=LATEST) for p in ps
                ),
            )
            for topic, ps in by_topic.items()
        ),
    )
    response = call(bootstrap, request)
    out = {}
    for topic in response.topics:
        for p in topic.partitions:
            assert p.error_code == ErrorCode.none, (topic.name, p)
            out[(topic.name, p.partition_index)] = p.offset
    return out


@dataclass(frozen=True)
class TxnListing:
    transactional_id: str
    producer_id: int
    state: str


def list_transactions(bootstrap: str, states: Iterable[str] = ()) -> list[TxnListing]:
    response = call(
        bootstrap, ListTransactionsRequest(state_filters=tuple(states), producer_id_filters=())
    )
    assert response.error_code == ErrorCode.none
    return [
        TxnListing(t.transactional_id, t.producer_id, t.transaction_state)
        for t in response.transaction_states
    ]


@dataclass(frozen=True)
class TxnDescription:
    error_code: int
    transactional_id: str
    transaction_state: str
    timeout_ms: int
    start_time_ms: int  # -1 when no transaction is open
    producer_id: int
    producer_epoch: int
    partitions: frozenset[TP]


def describe_transactions(bootstrap: str, ids: Iterable[str]) -> dict[str, TxnDescription]:
    """DescribeTransactions v0, by transactional id."""
    request = DescribeTransactionsRequest(transactional_ids=tuple(TransactionalId(i) for i in ids))
    response = call(bootstrap, request)
    return {
        t.transactional_id: TxnDescription(
            t.error_code,
            t.transactional_id,
            t.transaction_state,
            t.transaction_timeout // datetime.timedelta(milliseconds=1),
            t.transaction_start_time,  # int64 ms, -1 for none: see the client's response_class
            t.producer_id,
            t.producer_epoch,
            frozenset((d.topic, p) for d in t.topics for p in d.partitions),
        )
        for t in response.transaction_states
    }


def open_transaction_starts(bootstrap: str, tps: Iterable[TP]) -> dict[TP, list[int]]:
    """DescribeProducers: for each partition, the first offsets of transactions still open."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in tps:
        by_topic.setdefault(topic, []).append(partition)
    request = DescribeProducersRequest(
        topics=tuple(
            TopicRequest(name=TopicName(t), partition_indexes=tuple(i32(p) for p in ps))
            for t, ps in by_topic.items()
        )
    )
    response = call(bootstrap, request)
    out: dict[TP, list[int]] = {}
    for topic in response.topics:
        for p in topic.partitions:
            assert p.error_code == ErrorCode.none, (topic.name, p)
            starts = [s.current_txn_start_offset for s in p.active_producers]
            out[(topic.name, p.partition_index)] = [s for s in starts if s >= 0]
    return out


def end_txn(bootstrap: str, txn_id: str, pid: int, epoch: int, commit: bool) -> ErrorCode:
    """EndTxn v1 of the producer (id, epoch) of `txn_id`: the error code."""
    request = EndTxnRequest(
        transactional_id=TransactionalId(txn_id),
        producer_id=ProducerId(pid),
        producer_epoch=i16(epoch),
        committed=commit,
    )
    return call(bootstrap, request).error_code
