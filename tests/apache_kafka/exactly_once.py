"""Transactions against Apache Kafka with confluent-kafka, as an application writes them: retry
what librdkafka says is retriable, abort what it says needs an abort; and a read_committed
read of everything, to count each committed record once and no aborted one."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.confluent import QUIET

TXN_TIMEOUT_S = 60.0


def transactional_producer(bootstrap: str, transactional_id: str) -> Producer:
    """A producer after init_transactions, asked again until TXN_TIMEOUT_S while it fails:
    with a partition's leader just killed, the coordinator still completing the previous
    producer's transaction answers CONCURRENT_TRANSACTIONS until its markers are written. A
    producer whose error is fatal is made again, as librdkafka asks."""
    deadline = time.monotonic() + TXN_TIMEOUT_S
    while True:
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": transactional_id,
                "linger.ms": 5,
                # Longer than a leader's failover (broker.session.timeout.ms, 9 s) plus its
                # election.
                "transaction.timeout.ms": 60000,
                "message.timeout.ms": 60000,
                # librdkafka waits this long on a request to a paused (SIGSTOPped) coordinator
                # before it asks for the new one; its default, 60 s, outlasts the transaction.
                "socket.timeout.ms": 10000,
                **QUIET,
            }
        )
        while True:
            try:
                producer.init_transactions(max(1.0, deadline - time.monotonic()))
                return producer
            except KafkaException as e:
                if time.monotonic() >= deadline:
                    raise
                if e.args[0].fatal():
                    break
                time.sleep(0.2)  # the coordinator's markers take a moment: do not spin


def _retrying(what: str, call: Callable[[], None], deadline: float) -> None:
    """Call again while librdkafka says the error is retriable (as its docs ask of commit and
    abort), until the deadline."""
    while True:
        try:
            call()
            return
        except KafkaException as e:
            error = e.args[0]
            if not error.retriable() or time.monotonic() >= deadline:
                raise AssertionError(f"{what} failed: {error}") from e


def write_transaction(
    producer: Producer,
    topic: str,
    values: Iterable[bytes],
    *,
    partitions: Sequence[int] = (0,),
    commit: bool = True,
    mid_transaction: Callable[[], None] | None = None,
) -> bool:
    """One transaction of `values` spread over `partitions`, committed (or aborted when
    `commit` is false); `mid_transaction` runs after half the values are sent. True when the
    transaction committed; False when librdkafka required an abort and it was aborted."""
    deadline = time.monotonic() + TXN_TIMEOUT_S * 2
    values = list(values)
    producer.begin_transaction()
    for i, value in enumerate(values):
        if mid_transaction is not None and i == len(values) // 2:
            producer.flush(0)
            mid_transaction()
        producer.produce(topic, value=value, partition=partitions[i % len(partitions)])
        producer.poll(0)
    try:
        if commit:
            _retrying("commit", lambda: producer.commit_transaction(TXN_TIMEOUT_S), deadline)
            return True
    except AssertionError as failure:
        cause = failure.__cause__
        if not (isinstance(cause, KafkaException) and cause.args[0].txn_requires_abort()):
            raise
    _retrying("abort", lambda: producer.abort_transaction(TXN_TIMEOUT_S), deadline)
    return False


Record = tuple[int, int, bytes]  # (partition, offset, value)


def read_to_ends(
    bootstrap: str,
    topic: str,
    partitions: int,
    isolation: str = "read_committed",
    timeout: float = 60,
) -> list[Record]:
    """Every record a reader at `isolation` gets, from the start up to the ends as they are
    when called."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            **QUIET,
        }
    )
    try:
        tps = [TopicPartition(topic, p, 0) for p in range(partitions)]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
        consumer.assign(tps)
        records: list[Record] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"{topic} not read to its ends {ends}"
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        if msg.offset() >= ends[msg.partition()]:
                            at_end.add(msg.partition())
                        continue
                    raise AssertionError(f"reading {topic}: {msg.error()}")
                records.append((msg.partition(), msg.offset(), msg.value()))
        return records
    finally:
        consumer.close()


def read_committed(bootstrap: str, topic: str, partitions: int, timeout: float = 60) -> Counter:
    """How many times each value stands in the topic for a read_committed reader, read from
    the start up to the ends as they are when called."""
    return Counter(
        value for _, _, value in read_to_ends(bootstrap, topic, partitions, timeout=timeout)
    )
