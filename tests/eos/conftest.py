"""Helpers for the exactly-once tests: topics, transactional producers, a raw Kafka wire client
for the admin APIs the clients do not expose (ListTransactions, DescribeTransactions,
DescribeProducers, ListOffsets with both isolation levels), and the checker that reads every
partition back under read_committed and read_uncommitted."""

from __future__ import annotations

import datetime
import io
import socket
import struct
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.index import load_response_schema
from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
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
from kio.schema.types import BrokerId, GroupId, TopicName, TransactionalId
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32, i32Timedelta

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.records.builder import build_batch

TP = tuple[str, int]
READ_UNCOMMITTED = 0
READ_COMMITTED = 1
LATEST = -1
# librdkafka logs every refused connection while a broker is down; the tests check outcomes.
QUIET: dict[str, object] = {"log_level": 0}
# Transaction states with a decision still to carry out or a transaction still open.
HANGING_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")


@pytest.fixture(scope="package")
def timeout_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A broker that looks for timed-out transactions every 200 ms (Kafka: 10 s), shared by
    the tests of the transaction timeout (each with its own topic and transactional.id)."""
    broker = EmbeddedBroker(
        Path(tmp_path_factory.mktemp("timeout-broker")),
        settings={
            "group.initial.rebalance.delay.ms": "0",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
        },
    )
    broker.start()
    yield broker
    broker.stop()


def create_topics(bootstrap: str, topics: Mapping[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    futures = admin.create_topics([NewTopic(name, n, 1) for name, n in topics.items()])
    for future in futures.values():
        future.result(timeout=15)


def partitions_of(topics: Mapping[str, int]) -> list[TP]:
    return [(name, p) for name, n in topics.items() for p in range(n)]


# -- confluent-kafka producers ----------------------------------------------------------------


def transactional_producer(bootstrap: str, transactional_id: str, **conf: object) -> Producer:
    """A confluent-kafka transactional producer, initialised (InitProducerId done)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "linger.ms": 2,
            **QUIET,
            **conf,
        }
    )
    producer.init_transactions(30)
    return producer


class Deliveries:
    """Delivery reports of one producer: what was acknowledged where, and what failed."""

    def __init__(self) -> None:
        self.acked: list[tuple[str, int, int, bytes]] = []  # topic, partition, offset, value
        self.failed: list[tuple[bytes, KafkaError]] = []

    def __call__(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.failed.append((msg.value(), err))
        else:
            self.acked.append((msg.topic(), msg.partition(), msg.offset(), msg.value()))


def send(producer: Producer, records: Iterable[tuple[str, int, bytes]]) -> Deliveries:
    """Produce (topic, partition, value) records and flush; every one must be acknowledged."""
    deliveries = Deliveries()
    for topic, partition, value in records:
        producer.produce(topic, value=value, partition=partition, on_delivery=deliveries)
    assert producer.flush(30) == 0, "records still queued after 30 s"
    assert deliveries.failed == []
    return deliveries


# -- a raw Kafka client -----------------------------------------------------------------------


class KafkaWire:
    """One connection that sends kio request entities and parses the responses."""

    def __init__(self, bootstrap: str, timeout: float = 10.0) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.correlation_id = 0

    def __enter__(self) -> KafkaWire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def call(self, request: Any) -> Any:
        data = self.call_raw(request)
        response_cls = load_response_schema(request.__api_key__, request.__version__)
        body, _ = entity_reader(response_cls)(data, 0)
        return body

    def call_raw(self, request: Any) -> bytes:
        """Send the request; the response body's bytes (after the response header v0)."""
        self.correlation_id += 1
        header_cls = request.__header_schema__
        header = header_cls(
            request_api_key=request.__api_key__,
            request_api_version=request.__version__,
            correlation_id=self.correlation_id,
            client_id="eos-tests",
        )
        buf = io.BytesIO()
        entity_writer(header_cls)(buf, header)
        entity_writer(type(request))(buf, request)
        self.sock.sendall(struct.pack(">i", buf.tell()) + buf.getvalue())
        data = self._read(struct.unpack(">i", self._read(4))[0])
        assert struct.unpack_from(">i", data)[0] == self.correlation_id
        header = _Reader(data, 4)
        if request.__flexible__:  # response header v1
            header.skip_tagged_fields()
        return data[header.pos :]

    def _read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            out += chunk
        return bytes(out)


def init_producer_id(
    bootstrap: str, transactional_id: str | None = None, timeout_ms: int = 60_000
) -> tuple[ErrorCode, int, int]:
    """InitProducerId v1 over a raw connection: (error, producer id, epoch)."""
    request = InitProducerIdRequest(
        transactional_id=None if transactional_id is None else TransactionalId(transactional_id),
        transaction_timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=timeout_ms)),
    )
    with KafkaWire(bootstrap) as wire:
        response = wire.call(request)
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
    with KafkaWire(bootstrap) as wire:
        response = wire.call(request)
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
    with KafkaWire(bootstrap) as wire:
        response = wire.call(request)
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
    with KafkaWire(bootstrap) as wire:
        response = wire.call(request)
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
    with KafkaWire(bootstrap) as wire:
        response = wire.call(
            ListTransactionsRequest(state_filters=tuple(states), producer_id_filters=())
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
    with KafkaWire(bootstrap) as wire:
        data = wire.call_raw(request)
    out = {}
    for t in _parse_describe_transactions_v0(data):
        out[t.transactional_id] = t
    return out


class _Reader:
    """Kafka's flexible encoding: compact arrays and strings, tagged fields."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def length(self) -> int:
        return self.uvarint() - 1  # compact: N + 1, 0 for null

    def string(self) -> str:
        n = self.length()
        text = self.data[self.pos : self.pos + n].decode()
        self.pos += n
        return text

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.pos += self.uvarint()


def _parse_describe_transactions_v0(data: bytes) -> list[TxnDescription]:
    # By hand, since kio's reader refuses the -1 start time Kafka sends for an idle id.
    r = _Reader(data, 4)  # after the throttle time
    out = []
    for _ in range(r.length()):
        error, txn_id, state = r.take(">h"), r.string(), r.string()
        timeout, start, pid, epoch = r.take(">i"), r.take(">q"), r.take(">q"), r.take(">h")
        partitions = set()
        for _ in range(r.length()):
            topic = r.string()
            partitions.update((topic, r.take(">i")) for _ in range(r.length()))
            r.skip_tagged_fields()
        r.skip_tagged_fields()
        out.append(
            TxnDescription(error, txn_id, state, timeout, start, pid, epoch, frozenset(partitions))
        )
    r.skip_tagged_fields()
    assert r.pos == len(data), "trailing bytes after the DescribeTransactions response"
    return out


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
    with KafkaWire(bootstrap) as wire:
        response = wire.call(request)
    out: dict[TP, list[int]] = {}
    for topic in response.topics:
        for p in topic.partitions:
            assert p.error_code == ErrorCode.none, (topic.name, p)
            starts = [s.current_txn_start_offset for s in p.active_producers]
            out[(topic.name, p.partition_index)] = [s for s in starts if s >= 0]
    return out


def wait_settled(
    bootstrap: str, tps: Iterable[TP], timeout: float = 30.0, *, every_transaction: bool = False
) -> None:
    """Wait until no transaction is open or in doubt on these partitions (ListTransactions,
    then DescribeTransactions of each id; with `every_transaction`, on any partition: for a
    broker of the test's own), none is open in their producer state (DescribeProducers), and
    every last stable offset has caught up with its high watermark."""
    tps = list(tps)
    state: dict[str, object] = {}

    def settled() -> bool:
        listed = list_transactions(bootstrap)
        described = describe_transactions(bootstrap, [t.transactional_id for t in listed])
        lso = list_offsets(bootstrap, tps, READ_COMMITTED)  # first: see read_back
        hw = list_offsets(bootstrap, tps, READ_UNCOMMITTED)
        state.update(
            hanging={
                i: (d.transaction_state, sorted(d.partitions))
                for i, d in described.items()
                if (d.transaction_state in HANGING_STATES or d.error_code)
                and (every_transaction or d.partitions & set(tps))
            },
            open={tp: s for tp, s in open_transaction_starts(bootstrap, tps).items() if s},
            unstable={tp: (lso[tp], hw[tp]) for tp in tps if lso[tp] != hw[tp]},
        )
        return not any(state.values())

    deadline = time.monotonic() + timeout
    while not settled():
        assert time.monotonic() < deadline, f"not settled within {timeout} s: {state}"
        time.sleep(0.05)


# -- the checker ------------------------------------------------------------------------------


@dataclass
class PartitionRead:
    """One partition read from offset 0: values in offset order under each isolation level."""

    committed: list[bytes]  # read_committed, up to the last stable offset
    uncommitted: list[bytes]  # read_uncommitted, up to the high watermark
    high_watermark: int
    last_stable_offset: int


def read_values(
    bootstrap: str, ends: Mapping[TP, int], isolation: str, timeout: float
) -> dict[TP, list[bytes]]:
    """Values of each partition from offset 0 up to its end, with a confluent-kafka consumer;
    done when the consumer's position reaches the end (it also moves past control batches and
    aborted records, which are never delivered)."""
    out: dict[TP, list[bytes]] = {tp: [] for tp in ends}
    pending = {tp for tp, end in ends.items() if end > 0}
    if not pending:
        return out
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"checker-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "fetch.wait.max.ms": 50,
            **QUIET,
        }
    )
    try:
        consumer.assign([TopicPartition(t, p, 0) for t, p in pending])
        deadline = time.monotonic() + timeout
        while pending:
            for msg in consumer.consume(1000, timeout=0.1):
                assert msg.error() is None, msg.error()
                tp = (msg.topic(), msg.partition())
                if msg.offset() < ends[tp]:
                    out[tp].append(msg.value())
            for position in consumer.position([TopicPartition(t, p) for t, p in pending]):
                tp = (position.topic, position.partition)
                if position.offset >= ends[tp]:
                    pending.discard(tp)
            assert time.monotonic() < deadline, f"{isolation}: {sorted(pending)} short of {ends}"
    finally:
        consumer.close()
    return out


def read_back(bootstrap: str, tps: Iterable[TP], timeout: float = 30.0) -> dict[TP, PartitionRead]:
    """Read every partition from 0 with read_uncommitted (to the high watermark) and
    read_committed (to the last stable offset, which is the high watermark once nothing is
    open)."""
    tps = list(tps)
    # The last stable offset first: both only grow and LSO <= HW at any instant, so this
    # order gives a consistent pair while markers are still being written.
    lso = list_offsets(bootstrap, tps, READ_COMMITTED)
    hw = list_offsets(bootstrap, tps, READ_UNCOMMITTED)
    uncommitted = read_values(bootstrap, hw, "read_uncommitted", timeout)
    committed = read_values(bootstrap, lso, "read_committed", timeout)
    return {tp: PartitionRead(committed[tp], uncommitted[tp], hw[tp], lso[tp]) for tp in tps}


def duplicates(values: Iterable[bytes]) -> list[bytes]:
    return sorted(v for v, n in Counter(values).items() if n > 1)
