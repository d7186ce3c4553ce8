"""`onceflow bench-eos`: what exactly-once costs, measured in one run.

For each target: producer throughput of plain (acks=all), idempotent and transactional
producers (a commit every --commit-interval-ms), consumer throughput of read_committed and
read_uncommitted over one topic written by the transactional producers (with some of their
transactions aborted), and how long a commit takes. The ratios are printed next to Apache
Kafka's published targets, as met / not met: figures to read, never assertions.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from confluent_kafka import KafkaError, KafkaException, Producer
from rich.progress import Progress, TaskID
from rich.table import Table

from onceflow.cli.bench import (
    CONSUMER_SETTINGS,
    PRODUCER_SETTINGS,
    PRODUCER_WORKER,
    PROGRESS_EVERY,
    STALL_TIMEOUT_S,
    BenchError,
    Phase,
    ProducerJob,
    ProducerReport,
    TargetSpec,
    _split,
    bench_progress,
    consume_topic,
    create_topic,
    delete_topic,
    delivered_phase,
    median_phase,
    onceflow_launcher,
    parse_target,
    run_producer_processes,
    target_broker,
)
from onceflow.cli.options import (
    REQUEST_TIMEOUT_S,
    ClientErrors,
    CliError,
    UsageError,
    client_config,
    connect_admin,
    drain,
    kafka_error_text,
    note,
    parse_pairs,
    result_table,
    stdout_console,
)

DEFAULT_RECORDS = 1_000_000
DEFAULT_VALUE_SIZE = 100
DEFAULT_COMMIT_INTERVAL_MS = 100
DEFAULT_ABORT_RATIO = 0.1
DEFAULT_ROUNDS = 3
WORKER_MODULE = "onceflow.cli.bench_eos"
# The transactional producer looks at the clock every this many records: a few ms at most.
CLOCK_CHECK_EVERY = 64

PRODUCERS = ("plain", "idempotent", "transactional")
ISOLATIONS = ("read_uncommitted", "read_committed")

# The three producers share bench's throughput settings and differ only in what is measured.
# The local queue is bounded (in all three, to compare like with like) so that a commit
# flushes a few milliseconds of records, not seconds of backlog queued since the last one.
EOS_PRODUCER_SETTINGS: dict[str, Any] = {
    **{k: v for k, v in PRODUCER_SETTINGS.items() if k != "enable.idempotence"},
    "queue.buffering.max.messages": 20_000,
}
MODE_SETTINGS: dict[str, dict[str, Any]] = {
    "plain": {"enable.idempotence": False},
    "idempotent": {"enable.idempotence": True},
    "transactional": {"enable.idempotence": True},
}
EOS_CONSUMER_SETTINGS: dict[str, Any] = {
    **{k: v for k, v in CONSUMER_SETTINGS.items() if k != "isolation.level"},
    # librdkafka otherwise sleeps a whole second when its fetch queue is full.
    "fetch.queue.backoff.ms": 10,
}


# --- the transactional producer process ------------------------------------------------------


@dataclass(frozen=True)
class TxnProducerJob(ProducerJob):
    """A ProducerJob with transactions: commit every commit_interval_ms, abort some."""

    transactional_id: str = ""
    commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS
    abort_ratio: float = 0.0


@dataclass
class TxnProducerReport(ProducerReport):
    committed_records: int = 0
    aborted_records: int = 0
    # Call durations in ms; the records are flushed first, so these are the commits alone.
    commit_ms: list[float] = field(default_factory=list)
    abort_ms: list[float] = field(default_factory=list)
    flush_ms: list[float] = field(default_factory=list)
    transaction_ms: list[float] = field(default_factory=list)
    # From begin_transaction() to the first record's acknowledgement (seen at a poll).
    first_ack_ms: list[float] = field(default_factory=list)


def aborts(index: int, ratio: float) -> bool:
    """Whether transaction `index` is aborted: evenly spread, `ratio` of them in all, the first
    half-way into the first stretch (the 5th of 10 at 0.1), so a short round has some too."""
    return math.floor((index + 1) * ratio + 0.5) > math.floor(index * ratio + 0.5)


def producer_worker_main() -> int:
    """Entry point of a transactional producer process (protocol: bench.ProducerProcess)."""
    job = TxnProducerJob(**json.loads(sys.stdin.readline()))
    report = TxnProducerReport()
    try:
        _produce_transactions(job, report)
    except (KafkaException, BenchError, CliError, OSError) as exc:
        text = kafka_error_text(exc) if isinstance(exc, KafkaException) else str(exc)
        report.crashed = text
    print("report " + json.dumps(asdict(report)), flush=True)
    return 0


def _produce_transactions(job: TxnProducerJob, report: TxnProducerReport) -> None:
    # When the open transaction began, until its first record is acknowledged.
    awaiting_first_ack: list[float] = []

    def on_delivery(error: KafkaError | None, _message: object) -> None:
        if error is None:
            report.delivered += 1
            if awaiting_first_ack:
                report.first_ack_ms.append((time.monotonic() - awaiting_first_ack.pop()) * 1000)
            return
        report.failed += 1
        if report.first_error is None:
            report.first_error = kafka_error_text(error)

    errors = ClientErrors()
    config = {**job.settings, "transactional.id": job.transactional_id, "on_delivery": on_delivery}
    producer = Producer(client_config(job.bootstrap, errors, config))
    # Connected, with a producer id and epoch, before the clock runs.
    producer.init_transactions(REQUEST_TIMEOUT_S)
    producer.list_topics(job.topic, timeout=REQUEST_TIMEOUT_S)
    payload = os.urandom(job.value_size)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise BenchError("the start signal never came")
    produce, poll, clock = producer.produce, producer.poll, time.monotonic
    interval_s = job.commit_interval_ms / 1000
    sent = index = 0
    report.started = clock()
    while sent < job.records:
        producer.begin_transaction()
        began = clock()
        awaiting_first_ack[:] = [began]
        commit_at = began + interval_s
        in_transaction = 0
        while sent < job.records:
            try:
                produce(job.topic, payload)
            except BufferError:
                poll(0.001)  # local queue full: serve deliveries, then retry
                if clock() >= commit_at:
                    break  # a full queue must not stretch the transaction past its interval
                continue
            sent += 1
            in_transaction += 1
            if sent % CLOCK_CHECK_EVERY == 0:
                poll(0)
                if sent % PROGRESS_EVERY == 0:
                    print(f"progress {report.delivered}", flush=True)
                if clock() >= commit_at:
                    break
        _end_transaction(producer, report, aborts(index, job.abort_ratio), in_transaction)
        report.transaction_ms.append((clock() - began) * 1000)
        index += 1
        errors.raise_if_fatal()
    report.finished = clock()
    print(f"progress {report.delivered}", flush=True)


def _end_transaction(
    producer: Producer, report: TxnProducerReport, abort: bool, records: int
) -> None:
    """Flush, then commit or abort; the two are timed apart so a commit is the commit alone.

    commit_transaction() would flush by itself and the producer thread waits either way, so
    flushing first costs no throughput; it keeps the backlog's delivery out of the commit's
    figure. An aborted transaction's records are all written first, so read_committed
    consumers have aborted records to skip.
    """
    started = time.perf_counter()
    pending = drain(producer, STALL_TIMEOUT_S)
    if pending:
        raise BenchError(f"{pending} records still pending {STALL_TIMEOUT_S:g} s into a flush")
    flushed = time.perf_counter()
    if abort:
        producer.abort_transaction(REQUEST_TIMEOUT_S)
        report.aborted_records += records
    else:
        producer.commit_transaction(REQUEST_TIMEOUT_S)
        report.committed_records += records
    ended = time.perf_counter()
    report.flush_ms.append((flushed - started) * 1000)
    (report.abort_ms if abort else report.commit_ms).append((ended - flushed) * 1000)


# --- figures ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Latency:
    """Nearest-rank percentiles of call durations, in ms."""

    count: int
    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Latency | None:
        if not samples:
            return None
        ordered = sorted(samples)
        return cls(len(ordered), _rank(ordered, 0.50), _rank(ordered, 0.99), ordered[-1])

    def as_json(self) -> dict[str, float]:
        return {
            "count": self.count,
            "p50": round(self.p50, 3),
            "p99": round(self.p99, 3),
            "max": round(self.max, 3),
        }


def _rank(ordered: Sequence[float], quantile: float) -> float:
    return ordered[max(0, math.ceil(quantile * len(ordered)) - 1)]


@dataclass
class Transactions:
    """What the transactional producers did, summed over their processes."""

    committed: int = 0
    aborted: int = 0
    committed_records: int = 0
    aborted_records: int = 0
    commit: Latency | None = None
    abort: Latency | None = None
    flush: Latency | None = None
    first_ack: Latency | None = None
    duration: Latency | None = None

    @classmethod
    def of(cls, reports: Sequence[TxnProducerReport]) -> Transactions:
        def merged(name: str) -> list[float]:
            return [ms for report in reports for ms in getattr(report, name)]

        return cls(
            committed=sum(len(r.commit_ms) for r in reports),
            aborted=sum(len(r.abort_ms) for r in reports),
            committed_records=sum(r.committed_records for r in reports),
            aborted_records=sum(r.aborted_records for r in reports),
            commit=Latency.of(merged("commit_ms")),
            abort=Latency.of(merged("abort_ms")),
            flush=Latency.of(merged("flush_ms")),
            first_ack=Latency.of(merged("first_ack_ms")),
            duration=Latency.of(merged("transaction_ms")),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "committed": self.committed,
            "aborted": self.aborted,
            "committed_records": self.committed_records,
            "aborted_records": self.aborted_records,
            "commit_latency_ms": self.commit.as_json() if self.commit else None,
            "abort_latency_ms": self.abort.as_json() if self.abort else None,
            "flush_before_end_ms": self.flush.as_json() if self.flush else None,
            "begin_to_first_ack_ms": self.first_ack.as_json() if self.first_ack else None,
            "transaction_duration_ms": self.duration.as_json() if self.duration else None,
        }


@dataclass
class EosMeasurement:
    """Every round of one target; the tables show the median round of each kind."""

    target: str
    produce_rounds: dict[str, list[Phase]] = field(default_factory=dict)
    consume_rounds: dict[str, list[Phase]] = field(default_factory=dict)
    txn_reports: list[TxnProducerReport] = field(default_factory=list)
    # The topic the consumers read: (records in it, records in committed transactions).
    consumed_topic: tuple[int, int] | None = None
    error: str | None = None

    @property
    def produce(self) -> dict[str, Phase]:
        return _medians(self.produce_rounds)

    @property
    def consume(self) -> dict[str, Phase]:
        return _medians(self.consume_rounds)

    @property
    def transactions(self) -> Transactions | None:
        """Transactions of every round together (so the latencies have more samples)."""
        return Transactions.of(self.txn_reports) if self.txn_reports else None


def _medians(rounds: dict[str, list[Phase]]) -> dict[str, Phase]:
    found = {name: median_phase(phases) for name, phases in rounds.items()}
    return {name: phase for name, phase in found.items() if phase is not None}


@dataclass(frozen=True)
class KafkaTarget:
    """One of Apache Kafka's published figures for the cost of exactly-once."""

    key: str
    figure: str
    target: str
    measure: Callable[[EosMeasurement], float | None]
    met: Callable[[float], bool]
    unit: str = "x"

    def text(self, value: float | None) -> str:
        if value is None:
            return "-"
        return f"{value:.2f}x" if self.unit == "x" else f"{value:.1f} ms"


def _produce_ratio(top: str, bottom: str) -> Callable[[EosMeasurement], float | None]:
    def measure(m: EosMeasurement) -> float | None:
        a, b = m.produce.get(top), m.produce.get(bottom)
        if a is None or b is None or b.records_per_s == 0:
            return None
        return a.records_per_s / b.records_per_s

    return measure


def _consume_ratio(m: EosMeasurement) -> float | None:
    # Both read the same log; read_committed hands out fewer records (the aborted ones are
    # dropped), so the fair ratio is time to read it all: read_uncommitted's over committed's.
    committed, uncommitted = m.consume.get("read_committed"), m.consume.get("read_uncommitted")
    if committed is None or uncommitted is None or committed.seconds <= 0:
        return None
    return uncommitted.seconds / committed.seconds


def _commit_p99(m: EosMeasurement) -> float | None:
    if m.transactions is None or m.transactions.commit is None:
        return None
    return m.transactions.commit.p99


KAFKA_TARGETS = (
    KafkaTarget(
        "transactional_vs_idempotent",
        "transactional / idempotent producer",
        ">= 0.95x (within 5%)",
        _produce_ratio("transactional", "idempotent"),
        lambda v: v >= 0.95,
    ),
    KafkaTarget(
        "idempotent_vs_plain",
        "idempotent / plain producer",
        ">= 0.90x (within 10%)",
        _produce_ratio("idempotent", "plain"),
        lambda v: v >= 0.90,
    ),
    KafkaTarget(
        "read_committed_vs_read_uncommitted",
        "read_committed / read_uncommitted consumer",
        ">= 0.95x (within 5%)",
        _consume_ratio,
        lambda v: v >= 0.95,
    ),
    KafkaTarget(
        "commit_p99_ms",
        "commit_transaction() p99",
        "< 10 ms (fsync on)",
        _commit_p99,
        lambda v: v < 10.0,
        unit="ms",
    ),
)


def target_results(m: EosMeasurement) -> list[tuple[KafkaTarget, float | None, bool | None]]:
    """Each Kafka target with the measured figure and whether it is met (None: no figure)."""
    rows: list[tuple[KafkaTarget, float | None, bool | None]] = []
    for target in KAFKA_TARGETS:
        value = target.measure(m)
        rows.append((target, value, None if value is None else target.met(value)))
    return rows


# --- the run ------------------------------------------------------------------------------------


@dataclass
class EosSettings:
    records: int
    value_size: int
    producers: int
    partitions: int
    replication_factor: int
    commit_interval_ms: int
    abort_ratio: float
    rounds: int
    producer_settings: dict[str, Any] = field(default_factory=dict)
    consumer_settings: dict[str, Any] = field(default_factory=dict)


class EosRun:
    """Measures targets one at a time, showing progress on stderr."""

    def __init__(self, settings: EosSettings, progress: Progress) -> None:
        self.settings = settings
        self.progress = progress
        self.measurements: list[EosMeasurement] = []

    def measure(self, spec: TargetSpec) -> None:
        measurement = EosMeasurement(spec.name)
        try:
            with target_broker(spec, self.progress.console, "exactly-once") as (bootstrap, _):
                self._measure(bootstrap, measurement)
        except (CliError, KafkaException) as exc:
            text = kafka_error_text(exc) if isinstance(exc, KafkaException) else str(exc)
            note(f"{spec.name}: {text}")
            measurement.error = text
        self.measurements.append(measurement)

    def _measure(self, bootstrap: str, m: EosMeasurement) -> None:
        session = connect_admin(bootstrap)
        s = self.settings
        tasks: dict[str, TaskID] = {}
        kept: tuple[str, int] | None = None  # the last transactional topic, for the consumers
        try:
            # Rounds interleave the kinds, so a shared machine's drift touches each alike.
            for number in range(1, s.rounds + 1):
                for mode in PRODUCERS:
                    self._start(tasks, mode, f"{m.target} {mode}", number, s.records)
                    topic = f"onceflow-bench-eos-{mode}-{secrets.token_hex(4)}"
                    create_topic(session, topic, s.partitions, s.replication_factor)
                    keep = False
                    try:
                        phase, committed = self._produce(bootstrap, topic, mode, tasks[mode], m)
                        m.produce_rounds.setdefault(mode, []).append(phase)
                        if mode == "transactional":
                            if kept is not None:
                                delete_topic(session, kept[0])
                            kept, keep = (topic, committed), True
                    finally:
                        if not keep:
                            delete_topic(session, topic)
            assert kept is not None
            self._consume(bootstrap, *kept, tasks, m)
        finally:
            if kept is not None:
                delete_topic(session, kept[0])

    def _start(
        self, tasks: dict[str, TaskID], kind: str, label: str, number: int, total: int
    ) -> None:
        """One progress line per kind, reset at each round."""
        rounds = self.settings.rounds
        description = label if rounds == 1 else f"{label} {number}/{rounds}"
        if kind in tasks:
            self.progress.reset(tasks[kind], total=total, description=description)
        else:
            tasks[kind] = self.progress.add_task(description, total=total)

    def _produce(
        self, bootstrap: str, topic: str, mode: str, task: TaskID, m: EosMeasurement
    ) -> tuple[Phase, int]:
        """One round of one producer kind: its figures and how many records it committed."""
        s = self.settings
        config = {**s.producer_settings, **MODE_SETTINGS[mode]}
        shares = _split(s.records, s.producers)
        if mode != "transactional":
            # Warmed up: the transactional producer has its id from init_transactions() too.
            jobs = [ProducerJob(bootstrap, topic, n, s.value_size, config, True) for n in shares]
            reports = run_producer_processes(jobs, self.progress, task)
            return delivered_phase(reports, s.records, s.value_size), s.records
        run_id = secrets.token_hex(4)
        txn_jobs: list[ProducerJob] = [
            TxnProducerJob(
                bootstrap,
                topic,
                n,
                s.value_size,
                config,
                transactional_id=f"onceflow-bench-eos-{run_id}-{i}",
                commit_interval_ms=s.commit_interval_ms,
                abort_ratio=s.abort_ratio,
            )
            for i, n in enumerate(shares)
        ]
        reports = run_producer_processes(
            txn_jobs, self.progress, task, WORKER_MODULE, TxnProducerReport
        )
        phase = delivered_phase(reports, s.records, s.value_size)
        txn_reports = [r for r in reports if isinstance(r, TxnProducerReport)]
        m.txn_reports.extend(txn_reports)
        return phase, sum(r.committed_records for r in txn_reports)

    def _consume(
        self,
        bootstrap: str,
        topic: str,
        committed: int,
        tasks: dict[str, TaskID],
        m: EosMeasurement,
    ) -> None:
        # Every record was delivered before its transaction ended, aborted ones included.
        expected = {"read_uncommitted": self.settings.records, "read_committed": committed}
        m.consumed_topic = (self.settings.records, committed)
        for number in range(1, self.settings.rounds + 1):
            # read_committed first in odd rounds, second in even ones: a cold start or a warm
            # cache favours neither.
            order = ISOLATIONS[::-1] if number % 2 else ISOLATIONS
            for isolation in order:
                label = f"{m.target} {isolation}"
                self._start(tasks, isolation, label, number, expected[isolation])
                task = tasks[isolation]
                config = {**self.settings.consumer_settings, "isolation.level": isolation}
                phase = consume_topic(
                    bootstrap, topic, expected[isolation], config, self.progress, task, True
                )
                m.consume_rounds.setdefault(isolation, []).append(phase)


# --- report -------------------------------------------------------------------------------------


def producers_table(measurements: list[EosMeasurement]) -> Table:
    table = result_table("Target", "Producer", "Records", "rec/s", "MB/s", "Transactions")
    _right(table, 2)
    for m in measurements:
        for mode in PRODUCERS:
            phase = m.produce.get(mode)
            txns = "-"
            if mode == "transactional" and m.transactions is not None:
                t = m.transactions
                txns = f"{t.committed} committed, {t.aborted} aborted"
            table.add_row(m.target, mode, *_phase_cells(phase, m.error), txns)
    return table


def consumers_table(measurements: list[EosMeasurement]) -> Table:
    table = result_table("Target", "Isolation", "Records", "rec/s", "MB/s", "Seconds")
    _right(table, 2)
    for m in measurements:
        for isolation in ISOLATIONS:
            phase = m.consume.get(isolation)
            seconds = f"{phase.seconds:.2f}" if phase else "-"
            table.add_row(m.target, isolation, *_phase_cells(phase, m.error), seconds)
    return table


def latency_table(measurements: list[EosMeasurement]) -> Table:
    table = result_table("Target", "Step", "Count", "p50 ms", "p99 ms", "Max ms")
    _right(table, 2)
    for m in measurements:
        t = m.transactions or Transactions()
        for call, latency in (
            ("commit_transaction()", t.commit),
            ("abort_transaction()", t.abort),
            ("flush before commit/abort", t.flush),
            ("begin to first record acked", t.first_ack),
            ("whole transaction", t.duration),
        ):
            if latency is None:
                table.add_row(m.target, call, "0", "-", "-", "-")
                continue
            table.add_row(
                m.target,
                call,
                f"{latency.count:,}",
                f"{latency.p50:.1f}",
                f"{latency.p99:.1f}",
                f"{latency.max:.1f}",
            )
    return table


def targets_table(measurements: list[EosMeasurement]) -> Table:
    table = result_table("Target", "Figure", "Measured", "Kafka's target", "Result")
    for m in measurements:
        for target, value, met in target_results(m):
            result = "-" if met is None else ("met" if met else "not met")
            table.add_row(m.target, target.figure, target.text(value), target.target, result)
    return table


def _right(table: Table, first: int) -> None:
    for column in table.columns[first:]:
        column.justify = "right"


def _phase_cells(phase: Phase | None, error: str | None) -> list[str]:
    if phase is None:
        return ["-", f"failed: {error}" if error else "-", "-"]
    return [f"{phase.records:,}", f"{phase.records_per_s:,.0f}", f"{phase.mb_per_s:.1f}"]


def report_json(measurements: list[EosMeasurement], settings: EosSettings) -> dict[str, Any]:
    return {
        "settings": {
            "records": settings.records,
            "value_size": settings.value_size,
            "producers": settings.producers,
            "partitions": settings.partitions,
            "replication_factor": settings.replication_factor,
            "commit_interval_ms": settings.commit_interval_ms,
            "abort_ratio": settings.abort_ratio,
            "rounds": settings.rounds,
            "producer": dict(settings.producer_settings),
            "consumer": dict(settings.consumer_settings),
        },
        "results": [
            {
                "target": m.target,
                "error": m.error,
                "produce": {mode: phase.as_json() for mode, phase in m.produce.items()},
                "consume": {name: phase.as_json() for name, phase in m.consume.items()},
                "produce_rounds": _rounds_json(m.produce_rounds),
                "consume_rounds": _rounds_json(m.consume_rounds),
                "transactions": m.transactions.as_json() if m.transactions else None,
                "consumed_topic": (
                    dict(zip(("records", "committed_records"), m.consumed_topic, strict=True))
                    if m.consumed_topic
                    else None
                ),
                "kafka_targets": [
                    {
                        "key": target.key,
                        "figure": target.figure,
                        "measured": None if value is None else round(value, 4),
                        "target": target.target,
                        "met": met,
                    }
                    for target, value, met in target_results(m)
                ],
            }
            for m in measurements
        ],
    }


def _rounds_json(rounds: dict[str, list[Phase]]) -> dict[str, list[dict[str, float]]]:
    return {name: [phase.as_json() for phase in phases] for name, phases in rounds.items()}


# --- the command --------------------------------------------------------------------------------


def bench_eos_command(
    bootstrap_server: Annotated[
        list[str] | None,
        typer.Option(
            "--bootstrap-server",
            "-b",
            metavar="[NAME=]HOST:PORT",
            help="A running broker or cluster to measure; repeatable.",
        ),
    ] = None,
    embedded: Annotated[
        bool,
        typer.Option("--embedded", help="Start an onceflow broker (fsync on) and measure it."),
    ] = False,
    value_size: Annotated[int, typer.Option("--value-size", help="Value size in bytes.")] = (
        DEFAULT_VALUE_SIZE
    ),
    records: Annotated[
        int, typer.Option("--records", help="Records per producer kind (plain, idempotent, txn).")
    ] = DEFAULT_RECORDS,
    producers: Annotated[
        int, typer.Option("--producers", help="Producer processes per workload.")
    ] = 1,
    partitions: Annotated[int, typer.Option("--partitions", help="Partitions of each topic.")] = 6,
    replication_factor: Annotated[
        int, typer.Option("--replication-factor", help="Replicas of each benchmark topic.")
    ] = 1,
    commit_interval_ms: Annotated[
        int,
        typer.Option("--commit-interval-ms", help="Transactional producers commit this often."),
    ] = DEFAULT_COMMIT_INTERVAL_MS,
    abort_ratio: Annotated[
        float,
        typer.Option("--abort-ratio", help="Share of transactions aborted instead of committed."),
    ] = DEFAULT_ABORT_RATIO,
    rounds: Annotated[
        int,
        typer.Option("--rounds", help="Measure each kind this many times; show the median."),
    ] = DEFAULT_ROUNDS,
    producer_property: Annotated[
        list[str] | None,
        typer.Option(
            "--producer-property", metavar="KEY=VALUE", help="Override a producer setting."
        ),
    ] = None,
    consumer_property: Annotated[
        list[str] | None,
        typer.Option(
            "--consumer-property", metavar="KEY=VALUE", help="Override a consumer setting."
        ),
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the figures to this JSON file.")
    ] = None,
) -> None:
    """Throughput of plain, idempotent and transactional producers, read_committed and
    read_uncommitted consumers, and commit latency, next to Kafka's published targets."""
    for name, value, low in (
        ("--records", records, 1),
        ("--value-size", value_size, 1),
        ("--producers", producers, 1),
        ("--partitions", partitions, 1),
        ("--replication-factor", replication_factor, 1),
        ("--commit-interval-ms", commit_interval_ms, 1),
        ("--rounds", rounds, 1),
    ):
        if value < low:
            raise UsageError(f"{name} must be at least {low}, not {value}.")
    if not 0 <= abort_ratio < 1:
        raise UsageError(f"--abort-ratio must be at least 0 and below 1, not {abort_ratio:g}.")
    settings = EosSettings(
        records,
        value_size,
        producers,
        partitions,
        replication_factor,
        commit_interval_ms,
        abort_ratio,
        rounds,
        {**EOS_PRODUCER_SETTINGS, **parse_pairs(producer_property or [], "--producer-property")},
        {**EOS_CONSUMER_SETTINGS, **parse_pairs(consumer_property or [], "--consumer-property")},
    )
    specs = [parse_target(address) for address in bootstrap_server or []]
    if embedded or not specs:
        specs.append(TargetSpec("onceflow (fsync)", launch=onceflow_launcher(fsync=True)))
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise UsageError(f"Target names must differ: {', '.join(names)}.")

    progress = bench_progress()
    run = EosRun(settings, progress)
    with progress:
        for spec in specs:
            run.measure(spec)

    console = stdout_console()
    for table in (
        producers_table(run.measurements),
        consumers_table(run.measurements),
        latency_table(run.measurements),
        targets_table(run.measurements),
    ):
        console.print(table)
        console.print()
    if json_path is not None:
        json_path.write_text(json.dumps(report_json(run.measurements, settings), indent=2) + "\n")
    failed = [m for m in run.measurements if m.error]
    if failed:
        raise CliError(f"{len(failed)} of {len(run.measurements)} targets failed.")


if __name__ == "__main__":
    if sys.argv[1:] != [PRODUCER_WORKER]:
        sys.exit(f"usage: python -m {WORKER_MODULE} {PRODUCER_WORKER} (run by onceflow bench-eos)")
    sys.exit(producer_worker_main())
