"""The clients of a verify run, each in its own process, reporting operations to the harness.

Roles:
- producer: transactions of unique values over several partitions of several topics, some
  aborted on purpose; in the keyed workload (a compacted topic) each value has a key from a
  small key space per partition, so keys are overwritten often, and some writes are
  tombstones (a null value, named by its `id` header);
- copier: consume-transform-produce: reads the input topic read_committed in a consumer
  group, writes one copy of each value to the output topic and commits the consumed offsets
  in the same transaction (send_offsets_to_transaction, KIP-447 group metadata);
- reader: polls every partition from the beginning, read_committed or read_uncommitted;
- offsets: reads the copiers' committed group offsets (OffsetFetch, require_stable).

Every client behaves as a careful application does: retriable errors are retried, abortable
ones aborted, and after a fatal error (fenced, or a transaction the broker timed out) the
producer is replaced by a new instance with the same transactional.id, which fences the old.
Operations are written as JSON lines to stdout, which is a pipe to the harness.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from onceflow.verify.history import (
    ABORT,
    COMMIT,
    FAIL,
    INFO,
    INVOKE,
    OFFSETS,
    OK,
    POLL,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    TXN,
    TXN_END,
    UNKNOWN,
    WORKER,
)

PRODUCER, COPIER, READER, OFFSETS_READER = "producer", "copier", "reader", "offsets"
LOADER = "loader"  # the database workload's copier (database_workload.py)
ROLES = (PRODUCER, COPIER, READER, OFFSETS_READER)
COPY_MARK = ">"  # an output value is `<input value>><copier transaction>`


@dataclass(frozen=True)
class ClientCounts:
    """How many client processes of each role a run starts, and their transaction timeout:
    chosen in the run's options (harness.VerifyOptions), carried by its workload."""

    producers: int = 3
    copiers: int = 2
    committed_readers: int = 2
    uncommitted_readers: int = 1
    transaction_timeout_ms: int = 10_000
    # The copiers' group.protocol: "classic" or "consumer" (KIP-848).
    group_protocol: str = "classic"


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec(ClientCounts):
    """What the clients do; shared by the harness, the workers and the checker."""

    topics: dict[str, int]  # topics the producers write: name -> partitions
    copy_output: str
    copy_output_partitions: int
    copy_group: str
    abort_ratio: float = 0.2
    copy_abort_ratio: float = 1 / 3  # as Kafka's transactions system test
    max_partitions_per_txn: int = 3
    max_values_per_partition: int = 3
    keys_per_partition: int = 0  # > 0: keyed writes (the compacted workload)
    tombstone_ratio: float = 0.0  # of keyed writes
    # The database workload: the loaders' database URL and table (database_workload.py).
    sink_url: str = ""
    sink_table: str = ""

    @property
    def copy_input(self) -> str:
        return next(iter(self.topics))

    def data_partitions(self) -> list[tuple[str, int]]:
        return [(t, p) for t, n in self.topics.items() for p in range(n)]

    def all_partitions(self) -> list[tuple[str, int]]:
        output = [(self.copy_output, p) for p in range(self.copy_output_partitions)]
        return self.data_partitions() + output

    def input_partitions(self) -> list[tuple[str, int]]:
        return [(self.copy_input, p) for p in range(self.topics[self.copy_input])]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkloadSpec:
        return cls(**{**data, "topics": dict(data["topics"])})


@dataclass(frozen=True)
class WorkerSpec:
    """One client process: its role, slot (stable across restarts) and incarnation."""

    role: str
    slot: int
    incarnation: int
    bootstrap: str
    seed: int
    isolation: str = READ_COMMITTED
    settings: dict[str, str] = field(default_factory=dict)  # extra librdkafka settings

    @property
    def name(self) -> str:
        """The slot's name: its transactional.id and its proxy listener are keyed by it."""
        if self.role == READER:
            kind = "rc" if self.isolation == READ_COMMITTED else "ru"
            return f"reader-{kind}{self.slot}"
        return f"{self.role}{self.slot}"

    @property
    def process(self) -> str:
        """The history's process: a new one for each incarnation, as Jepsen does."""
        return f"{self.name}#{self.incarnation}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerSpec:
        return cls(**data)


class OpStream:
    """Operations as JSON lines on a file descriptor (a pipe to the harness).

    One os.write per line, so a line is never interleaved, and nothing is left in a buffer
    when the process is SIGKILLed after emitting it."""

    def __init__(self, fd: int = 1) -> None:
        self.fd = fd

    def emit(self, type_: str, f: str, value: dict[str, Any], at: float | None = None) -> None:
        line = {"type": type_, "f": f, "value": value, "at": time.monotonic() if at is None else at}
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]


def text(raw: bytes | None) -> str:
    return "" if raw is None else raw.decode("utf-8", "backslashreplace")


ID_HEADER = "id"  # names a tombstone, whose value is null


def identity(message: Message) -> str:
    """The unique name of a record: its value, or a tombstone's `id` header."""
    value = message.value()
    if value is not None:
        return text(value)
    for name, raw in message.headers() or []:
        if name == ID_HEADER:
            return text(raw)
    return ""


def keyed_writes(
    rng: random.Random, txn: str, chosen: list[tuple[str, int]], workload: WorkloadSpec
) -> tuple[list[tuple[str, int, str]], dict[str, tuple[str, bool]]]:
    """A keyed transaction's writes and, per value, its key and whether it is a tombstone.
    A key belongs to one partition (its name says which), as a partitioner would place it."""
    writes: list[tuple[str, int, str]] = []
    keys: dict[str, tuple[str, bool]] = {}
    for topic, partition in chosen:
        for i in range(rng.randint(1, workload.max_values_per_partition)):
            key = f"k{partition}-{rng.randrange(workload.keys_per_partition)}"
            tombstone = rng.random() < workload.tombstone_ratio
            value = f"{txn}.{key}.{i}" + (".tombstone" if tombstone else "")
            writes.append((topic, partition, value))
            keys[value] = (key, tombstone)
    return writes, keys


Emit = Callable[..., None]  # (type, f, value, at=None): OpStream.emit, or History.append's


def record_poll(emit: Emit, isolation: str, got: list[Message], started: float) -> None:
    """A poll that returned records: its invocation (when it began) and what it got."""
    emit(INVOKE, POLL, {"isolation": isolation}, at=started)
    out = [[m.topic(), m.partition(), m.offset(), identity(m)] for m in got]
    emit(OK, POLL, {"isolation": isolation, "records": out})


def record_committed_offsets(
    emit: Emit, consumer: Consumer, group: str, tps: list[TopicPartition], timeout_s: float
) -> None:
    """The group's committed offsets of `tps` (OffsetFetch, read_committed consumer: no
    pending offsets returned), or why they could not be read."""
    emit(INVOKE, OFFSETS, {"group": group})
    try:
        committed = consumer.committed(tps, timeout=timeout_s)
    except KafkaException as e:
        emit(FAIL, OFFSETS, {"group": group, "error": str(e.args[0])})
        return
    errors = [f"{tp.topic}-{tp.partition}: {tp.error}" for tp in committed if tp.error]
    if errors:
        emit(FAIL, OFFSETS, {"group": group, "error": errors})
    else:
        found = [[tp.topic, tp.partition, tp.offset] for tp in committed]
        emit(OK, OFFSETS, {"group": group, "offsets": found})


def base_config(spec: WorkerSpec, workload: WorkloadSpec) -> dict[str, Any]:
    """librdkafka settings for a client that must live through broker restarts and pauses."""
    # Short, so that a paused broker or a black-holed connection trips them (librdkafka
    # wants them no longer than the transaction timeout).
    request_timeout_ms = min(6000, workload.transaction_timeout_ms)
    return {
        "bootstrap.servers": spec.bootstrap,
        "client.id": spec.process,
        # librdkafka re-bootstraps when every broker is down, and its transactional producer
        # then never finds its coordinator again: with one broker that is every restart.
        "metadata.recovery.strategy": "none",
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
        "retry.backoff.ms": 50,
        "retry.backoff.max.ms": 500,
        "socket.timeout.ms": request_timeout_ms,
        "socket.connection.setup.timeout.ms": request_timeout_ms,
        "log_level": 3,
        **spec.settings,
    }


class ClientError(RuntimeError):
    """A client could not get back to a working state: the worker exits and is restarted."""


class TransactionalClient:
    """A transactional producer that an application keeps working through faults."""

    def __init__(
        self,
        spec: WorkerSpec,
        workload: WorkloadSpec,
        stream: OpStream,
        stop: threading.Event,
    ) -> None:
        self.spec, self.stream, self.stop = spec, stream, stop
        self.transaction_timeout_s = workload.transaction_timeout_ms / 1000
        self.call_timeout_s = max(5.0, self.transaction_timeout_s)
        self.instance = 0
        self.config = {
            **base_config(spec, workload),
            "transactional.id": spec.name,
            "transaction.timeout.ms": workload.transaction_timeout_ms,
            "request.timeout.ms": min(6000, workload.transaction_timeout_ms),
            "linger.ms": 5,
        }
        self.producer: Producer | None = None

    def ensure(self) -> Producer:
        """An initialised producer (InitProducerId done), made anew after a fatal error."""
        deadline = time.monotonic() + 120
        while self.producer is None:
            self.instance += 1
            producer = Producer(self.config)
            while True:
                try:
                    producer.init_transactions(self.call_timeout_s)
                    self.producer = producer
                    break
                except KafkaException as e:
                    error: KafkaError = e.args[0]
                    self.stream.emit(INFO, WORKER, {"event": "init-failed", "error": str(error)})
                    if time.monotonic() > deadline or self.stop.is_set():
                        raise ClientError(f"init_transactions keeps failing: {error}") from e
                    if error.fatal() or not error.retriable():
                        break  # a new instance
                    time.sleep(0.2)
        return self.producer

    def replace(self) -> None:
        """Drop the producer; the next ensure() creates one whose InitProducerId fences it."""
        if self.producer is not None:
            self.producer.purge()
        self.producer = None

    def transaction(
        self,
        txn: str,
        intent: str,
        writes: list[tuple[str, int, str]],
        *,
        offsets: list[TopicPartition] | None = None,
        group_metadata: Callable[[], Any] | None = None,
        extra: dict[str, Any] | None = None,
        keys: dict[str, tuple[str, bool]] | None = None,
    ) -> str:
        """Run one transaction, record it (invoke, txn-end, completion), return its outcome.
        `keys` gives keyed writes their key and whether they are tombstones."""
        producer = self.ensure()
        delivered: list[list[Any]] = []
        refused: list[str] = []

        def on_delivery(value: str) -> Callable[[KafkaError | None, Message], None]:
            # The value written, not the message's: a delivery report has no headers, and a
            # tombstone is named by its header.
            def report(err: KafkaError | None, msg: Message) -> None:
                if err is None:
                    delivered.append([msg.topic(), msg.partition(), msg.offset(), value])
                else:
                    refused.append(f"{value}: {err}")

            return report

        invoke: dict[str, Any] = {"txn": txn, "intent": intent, "writes": [list(w) for w in writes]}
        if keys:
            invoke["keys"] = {value: [key, dead] for value, (key, dead) in keys.items()}
        self.stream.emit(INVOKE, TXN, {**invoke, **(extra or {})})
        commit_requested = False
        try:
            producer.begin_transaction()
            for topic, partition, value in writes:
                key, tombstone = (keys or {}).get(value, (None, False))
                self._produce(producer, topic, partition, value, on_delivery(value), key, tombstone)
            producer.flush(self.call_timeout_s)
            if offsets:
                assert group_metadata is not None
                producer.send_offsets_to_transaction(offsets, group_metadata(), self.call_timeout_s)
            self.stream.emit(INFO, TXN_END, {"txn": txn, "end": intent, "delivered": delivered})
            commit_requested = intent == COMMIT
            self._end(producer, commit=commit_requested)
            outcome = OK if commit_requested else FAIL
            error = None if commit_requested else "aborted on purpose"
            self.stream.emit(outcome, TXN, {"txn": txn, "delivered": delivered, "error": error})
            return outcome
        except KafkaException as e:
            error_obj: KafkaError = e.args[0]
            if error_obj.txn_requires_abort() and not error_obj.fatal():
                try:
                    self._end(producer, commit=False)
                    value = {"txn": txn, "delivered": delivered, "error": str(error_obj)}
                    self.stream.emit(FAIL, TXN, value)
                    return FAIL
                except KafkaException as e2:
                    error_obj = e2.args[0]
            # Without a successful commit or abort the outcome is decided by the broker (the
            # next instance's InitProducerId, or the transaction timeout): unknown if the
            # commit was requested, else certainly not committed.
            outcome = UNKNOWN if commit_requested else FAIL
            detail = str(error_obj) + (f"; refused: {refused[:3]}" if refused else "")
            self.stream.emit(outcome, TXN, {"txn": txn, "delivered": delivered, "error": detail})
            self.replace()
            return outcome

    def _produce(
        self,
        producer: Producer,
        topic: str,
        partition: int,
        value: str,
        on_delivery: Callable[[KafkaError | None, Message], None],
        key: str | None = None,
        tombstone: bool = False,
    ) -> None:
        extra: dict[str, Any] = {}
        if key is not None:
            extra["key"] = key.encode()
        if tombstone:  # a null value: the record is named by its header
            extra["headers"] = [(ID_HEADER, value.encode())]
        while True:
            try:
                producer.produce(
                    topic,
                    value=None if tombstone else value.encode(),
                    partition=partition,
                    on_delivery=on_delivery,
                    **extra,
                )
                return
            except BufferError:
                producer.poll(0.05)

    def _end(self, producer: Producer, *, commit: bool) -> None:
        """commit_transaction / abort_transaction, called again while the error is retriable,
        as librdkafka documents."""
        deadline = time.monotonic() + 6 * self.call_timeout_s
        while True:
            try:
                if commit:
                    producer.commit_transaction(self.call_timeout_s)
                else:
                    producer.abort_transaction(self.call_timeout_s)
                return
            except KafkaException as e:
                error: KafkaError = e.args[0]
                if not error.retriable() or error.fatal() or time.monotonic() > deadline:
                    raise

    def close(self) -> None:
        if self.producer is not None:
            self.producer.flush(5)
            self.producer = None


# -- roles ---------------------------------------------------------------------------------------


def run_producer(
    spec: WorkerSpec, workload: WorkloadSpec, stream: OpStream, stop: threading.Event
) -> None:
    rng = random.Random(f"{spec.seed}/{spec.process}")
    client = TransactionalClient(spec, workload, stream, stop)
    partitions = workload.data_partitions()
    number = 0
    while not stop.is_set():
        number += 1
        txn = f"{spec.process}.{number}"
        chosen = rng.sample(
            partitions, rng.randint(1, min(workload.max_partitions_per_txn, len(partitions)))
        )
        keys: dict[str, tuple[str, bool]] | None = None
        if workload.keys_per_partition:
            writes, keys = keyed_writes(rng, txn, chosen, workload)
        else:
            writes = [
                (topic, partition, f"{txn}.{topic[-1]}{partition}.{i}")
                for topic, partition in chosen
                for i in range(rng.randint(1, workload.max_values_per_partition))
            ]
        intent = ABORT if rng.random() < workload.abort_ratio else COMMIT
        client.transaction(txn, intent, writes, keys=keys)
        time.sleep(rng.uniform(0, 0.05))
    client.close()


def run_copier(
    spec: WorkerSpec, workload: WorkloadSpec, stream: OpStream, stop: threading.Event
) -> None:
    rng = random.Random(f"{spec.seed}/{spec.process}")
    client = TransactionalClient(spec, workload, stream, stop)
    # The consumer protocol takes its session and heartbeat settings from the broker.
    classic = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}
    consumer = Consumer(
        {
            **base_config(spec, workload),
            "group.id": workload.copy_group,
            "group.protocol": workload.group_protocol,
            "isolation.level": READ_COMMITTED,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **(classic if workload.group_protocol == "classic" else {}),
            "max.poll.interval.ms": 60_000,
        }
    )
    consumer.subscribe([workload.copy_input])
    number = 0
    try:
        while not stop.is_set():
            client.ensure()
            messages = consumer.consume(rng.randint(1, 100), 0.5)
            got = [m for m in messages if m.error() is None]
            for m in messages:
                if m.error() is not None:
                    stream.emit(INFO, WORKER, {"event": "consume-error", "error": str(m.error())})
            if not got:
                continue
            number += 1
            txn = f"{spec.process}.{number}"
            reads = [[m.topic(), m.partition(), m.offset(), text(m.value())] for m in got]
            next_offsets: dict[tuple[str, int], int] = {}
            for m in got:
                key = (m.topic(), m.partition())
                next_offsets[key] = max(next_offsets.get(key, 0), m.offset() + 1)
            writes = [
                (
                    workload.copy_output,
                    m.partition() % workload.copy_output_partitions,
                    f"{text(m.value())}{COPY_MARK}{txn}",
                )
                for m in got
            ]
            intent = ABORT if rng.random() < workload.copy_abort_ratio else COMMIT
            outcome = client.transaction(
                txn,
                intent,
                writes,
                offsets=[TopicPartition(t, p, o) for (t, p), o in next_offsets.items()],
                group_metadata=consumer.consumer_group_metadata,
                extra={
                    "reads": reads,
                    "offsets": [[t, p, o] for (t, p), o in next_offsets.items()],
                    "group": workload.copy_group,
                },
            )
            if outcome != OK:
                rewind(consumer, stream)
    finally:
        consumer.close()
        client.close()


def rewind(consumer: Consumer, stream: OpStream) -> None:
    """After a transaction that did not commit (or may not have), go back to the group's
    committed offsets, so that what it consumed is consumed again."""
    deadline = time.monotonic() + 60
    while True:
        assignment = consumer.assignment()
        try:
            committed = consumer.committed(assignment, timeout=10) if assignment else []
            for tp in committed:
                offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
            return
        except KafkaException as e:
            stream.emit(INFO, WORKER, {"event": "rewind-failed", "error": str(e.args[0])})
            if time.monotonic() > deadline:
                raise ClientError(f"cannot rewind to the committed offsets: {e}") from e
            time.sleep(0.2)


def run_reader(
    spec: WorkerSpec, workload: WorkloadSpec, stream: OpStream, stop: threading.Event
) -> None:
    consumer = Consumer(
        {
            **base_config(spec, workload),
            "group.id": f"verify-{spec.name}",  # never joined: partitions are assigned
            "isolation.level": spec.isolation,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in workload.all_partitions()])
    try:
        while not stop.is_set():
            started = time.monotonic()
            messages = consumer.consume(500, 0.5)
            got = [m for m in messages if m.error() is None]
            for m in messages:
                if m.error() is not None:
                    stream.emit(INFO, WORKER, {"event": "consume-error", "error": str(m.error())})
            if got:
                record_poll(stream.emit, spec.isolation, got, started)
    finally:
        consumer.close()


def run_offsets_reader(
    spec: WorkerSpec, workload: WorkloadSpec, stream: OpStream, stop: threading.Event
) -> None:
    consumer = Consumer(
        {
            **base_config(spec, workload),
            "group.id": workload.copy_group,  # never joined: only OffsetFetch
            "isolation.level": READ_COMMITTED,  # require_stable: no pending offsets returned
            "enable.auto.commit": False,
        }
    )
    tps = [TopicPartition(t, p) for t, p in workload.input_partitions()]
    try:
        while not stop.is_set():
            record_committed_offsets(stream.emit, consumer, workload.copy_group, tps, 5)
            stop.wait(0.5)
    finally:
        consumer.close()


RUNNERS: dict[str, Callable[[WorkerSpec, WorkloadSpec, OpStream, threading.Event], None]] = {
    PRODUCER: run_producer,
    COPIER: run_copier,
    READER: run_reader,
    OFFSETS_READER: run_offsets_reader,
}
ISOLATIONS = (READ_COMMITTED, READ_UNCOMMITTED)
