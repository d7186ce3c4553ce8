"""`onceflow bench-eos`'s run: what exactly-once costs, measured in one run.

For each target: producer throughput of plain (acks=all), idempotent and transactional
producers (a commit every --commit-interval-ms), consumer throughput of read_committed and
read_uncommitted over one topic written by the transactional producers (with some of their
transactions aborted), and how long a commit takes.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException
from rich.progress import Progress, TaskID

from onceflow.bench.consumer import CONSUMER_SETTINGS, consume_topic
from onceflow.bench.eos_figures import ISOLATIONS, PRODUCERS, EosMeasurement
from onceflow.bench.eos_producer import WORKER_MODULE, TxnProducerJob, TxnProducerReport
from onceflow.bench.producers import (
    PRODUCER_SETTINGS,
    ProducerJob,
    ProducerReport,
    delivered_phase,
    run_producer_processes,
    split_records,
)
from onceflow.bench.progress import round_task
from onceflow.bench.stats import BrokerCost, Phase
from onceflow.bench.targets import (
    Broker,
    TargetSpec,
    cpu_seconds,
    onceflow_launcher,
    parse_target,
    target_broker,
)
from onceflow.bench.topics import create_topic, delete_topic
from onceflow.bench.workload import shape_checks
from onceflow.tools.clients import AdminSession, Cluster, connect_admin
from onceflow.tools.errors import CliError, UsageError, error_text
from onceflow.tools.option_values import require_at_least
from onceflow.tools.output import note

DEFAULT_RECORDS = 1_000_000
DEFAULT_VALUE_SIZE = 100
DEFAULT_ABORT_RATIO = 0.1
DEFAULT_ROUNDS = 3

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
    # Untimed producer rounds before the measured ones (figures dropped), every target alike.
    warm_up_rounds: int = 0

    def check(self) -> None:
        """UsageError for a figure out of range."""
        require_at_least(
            *shape_checks(self.producers, self.partitions, self.replication_factor, self.rounds),
            ("--records", self.records, 1),
            ("--value-size", self.value_size, 1),
            ("--commit-interval-ms", self.commit_interval_ms, 1),
            ("--warm-up-rounds", self.warm_up_rounds, 0),
        )
        if not 0 <= self.abort_ratio < 1:
            raise UsageError(
                f"--abort-ratio must be at least 0 and below 1, not {self.abort_ratio:g}."
            )


@dataclass
class LiveEosTarget:
    """A target during the rounds: its address, admin session and broker (if started here),
    the topic its consumers will read, and a progress line per kind."""

    spec: TargetSpec
    m: EosMeasurement
    bootstrap: str
    broker: Broker | None
    session: AdminSession | None
    tasks: dict[str, TaskID] = field(default_factory=dict)
    # The last transactional topic and how many of its records were committed.
    kept: tuple[str, int] | None = None
    failed: bool = False

    def cpu(self) -> float | None:
        return cpu_seconds(self.broker.pid) if self.broker is not None else None

    def cpu_since(self, before: float | None) -> float | None:
        after = self.cpu()
        return None if before is None or after is None else after - before


class EosRun:
    """Measures every target in rounds, interleaved within each (as `onceflow bench`), showing
    progress on stderr. Every broker the benchmark starts runs from before the first round to
    after the last; a target that fails is reported and left out of the rounds that remain."""

    def __init__(self, settings: EosSettings, progress: Progress) -> None:
        self.settings = settings
        self.progress = progress
        self.measurements: list[EosMeasurement] = []

    def measure(self, specs: Sequence[TargetSpec]) -> None:
        self.measurements = [EosMeasurement(spec.name) for spec in specs]
        with ExitStack() as brokers:
            live = [
                target
                for spec, m in zip(specs, self.measurements, strict=True)
                if (target := self._start(spec, m, brokers)) is not None
            ]
            try:
                # Rounds interleave targets and kinds, so a shared machine's drift touches
                # each alike; rounds up to 0 warm up (a JVM compiles in its first workloads).
                for number in range(1 - self.settings.warm_up_rounds, self.settings.rounds + 1):
                    for target in live:
                        self._guarded(target, self._produce_round, number)
                for number in range(1, self.settings.rounds + 1):
                    for target in live:
                        self._guarded(target, self._consume_round, number)
            finally:
                for target in live:
                    if target.kept is not None and target.session is not None:
                        delete_topic(target.session, target.kept[0])
                    target.session = None  # before the broker stops

    def _start(
        self, spec: TargetSpec, m: EosMeasurement, brokers: ExitStack
    ) -> LiveEosTarget | None:
        """The target, connected (its broker started and left running in `brokers`)."""
        try:
            with ExitStack() as stack:
                bootstrap, broker = stack.enter_context(
                    target_broker(spec, self.progress.console, "exactly-once")
                )
                target = LiveEosTarget(
                    spec, m, bootstrap, broker, connect_admin(Cluster(bootstrap))
                )
                brokers.enter_context(stack.pop_all())
                return target
        except (CliError, KafkaException) as exc:
            self._fail(m, exc)
            return None

    def _fail(self, m: EosMeasurement, exc: CliError | KafkaException) -> None:
        text = error_text(exc)
        note(f"{m.target}: {text}")
        m.error = m.error or text

    def _guarded(
        self, target: LiveEosTarget, step: Callable[[LiveEosTarget, int], None], number: int
    ) -> None:
        if target.failed:
            return
        try:
            step(target, number)
        except (CliError, KafkaException) as exc:
            target.failed = True
            self._fail(target.m, exc)

    def _produce_round(self, target: LiveEosTarget, number: int) -> None:
        """One round of each producer kind, each on a topic of its own (a warm-up round's
        figures go to a measurement that is dropped)."""
        s, session = self.settings, target.session
        m = target.m if number >= 1 else EosMeasurement(target.m.target)
        assert session is not None
        for mode in PRODUCERS:
            self._start_task(target, mode, f"{m.target} {mode}", number, s.records)
            topic = f"onceflow-bench-eos-{mode}-{secrets.token_hex(4)}"
            create_topic(session, topic, s.partitions, s.replication_factor)
            keep = False
            try:
                cpu = target.cpu()
                phase, committed, reports = self._produce(target, topic, mode, m)
                m.produce_rounds.setdefault(mode, []).append(phase)
                m.produce_costs.setdefault(mode, []).append(
                    BrokerCost(
                        phase.records,
                        target.cpu_since(cpu),
                        sum(r.produce_requests for r in reports),
                        [tuple(w) for r in reports for w in r.rtt_windows],
                    )
                )
                if mode == "transactional":
                    if target.kept is not None:
                        delete_topic(session, target.kept[0])
                    target.kept, keep = (topic, committed), True
            finally:
                if not keep:
                    delete_topic(session, topic)

    def _start_task(
        self, target: LiveEosTarget, kind: str, label: str, number: int, total: int
    ) -> None:
        """One progress line per target and kind, reset at each round."""
        rounds = self.settings.rounds
        description = label if rounds == 1 else f"{label} {number}/{rounds}"
        if number < 1:
            description = f"{label} warm-up"
        round_task(self.progress, target.tasks, kind, description, total)

    def _produce(
        self, target: LiveEosTarget, topic: str, mode: str, m: EosMeasurement
    ) -> tuple[Phase, int, list[ProducerReport]]:
        """One round of one producer kind: its figures, how many records it committed, and
        the producers' reports."""
        s, bootstrap, task = self.settings, target.bootstrap, target.tasks[mode]
        config = {**s.producer_settings, **MODE_SETTINGS[mode]}
        shares = split_records(s.records, s.producers)
        if mode != "transactional":
            # Warmed up: the transactional producer has its id from init_transactions() too.
            jobs = [ProducerJob(bootstrap, topic, n, s.value_size, config, True) for n in shares]
            reports = run_producer_processes(jobs, self.progress, task)
            return delivered_phase(reports, s.records, s.value_size), s.records, reports
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
        return phase, sum(r.committed_records for r in txn_reports), reports

    def _consume_round(self, target: LiveEosTarget, number: int) -> None:
        """Both isolation levels read the last transactional topic to its end."""
        assert target.kept is not None
        topic, committed = target.kept
        m = target.m
        # Every record was delivered before its transaction ended, aborted ones included.
        expected = {"read_uncommitted": self.settings.records, "read_committed": committed}
        m.consumed_topic = (self.settings.records, committed)
        # read_committed first in odd rounds, second in even ones: a cold start or a warm
        # cache favours neither.
        order = ISOLATIONS[::-1] if number % 2 else ISOLATIONS
        for isolation in order:
            label = f"{m.target} {isolation}"
            self._start_task(target, isolation, label, number, expected[isolation])
            task = target.tasks[isolation]
            config = {**self.settings.consumer_settings, "isolation.level": isolation}
            cpu = target.cpu()
            phase = consume_topic(
                target.bootstrap, topic, expected[isolation], config, self.progress, task, True
            )
            m.consume_rounds.setdefault(isolation, []).append(phase)
            m.consume_costs.setdefault(isolation, []).append(
                BrokerCost(phase.records, target.cpu_since(cpu))
            )


def eos_targets(
    addresses: list[str], embedded: bool, kafka: Sequence[TargetSpec] = ()
) -> list[TargetSpec]:
    """The given addresses, then (with --embedded, or when no other is given) an onceflow
    broker, then the Apache Kafka targets (kafka_target.kafka_targets)."""
    specs = [parse_target(address) for address in addresses]
    if embedded or not (specs or kafka):
        specs.append(TargetSpec("onceflow (fsync)", launch=onceflow_launcher(fsync=True)))
    specs.extend(kafka)
    return specs
