"""`onceflow bench`'s run: every target measured in rounds, interleaved within each.

One workload runs at a time, so targets do not compete for the machine; a shared machine's
drift touches each alike. Brokers the benchmark starts run from the first round to the
last, idle but for their own workloads, and get their RSS measured.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from confluent_kafka import KafkaException
from rich.progress import Progress, TaskID

from onceflow.bench.consumer import consume_topic
from onceflow.bench.producers import (
    ProducerJob,
    ProducerReport,
    delivered_phase,
    run_producer_processes,
    split_records,
)
from onceflow.bench.progress import round_task
from onceflow.bench.render import size_text
from onceflow.bench.stats import BrokerCost, Phase
from onceflow.bench.targets import (
    Broker,
    RssSampler,
    TargetSpec,
    cpu_seconds,
    settled_rss,
    target_broker,
)
from onceflow.bench.throughput import BenchSettings, IdleMeasurement, Measurement
from onceflow.bench.topics import create_topic, delete_topic
from onceflow.tools.clients import AdminSession, Cluster, connect_admin
from onceflow.tools.errors import CliError, error_text
from onceflow.tools.output import note


@dataclass
class LiveTarget:
    """A target during the rounds: its admin session, and its broker if started here."""

    spec: TargetSpec
    broker: Broker | None
    session: AdminSession | None = None
    failed: bool = False

    def disconnect(self) -> None:
        """Drop the admin session, before the broker stops: some brokers wait for clients."""
        self.session = None


class BenchRun:
    """Measures the targets in rounds, interleaved within each, showing progress on stderr.

    Every broker the benchmark starts runs from before the first round to after the last:
    only one workload runs at a time, so the others sit idle meanwhile. A target that fails
    is reported and left out of the rounds that remain.
    """

    def __init__(self, settings: BenchSettings, progress: Progress) -> None:
        self.settings = settings
        self.progress = progress
        self.measurements: list[Measurement] = []
        self.idle: list[IdleMeasurement] = []
        self._tasks: dict[tuple[str, int, str], TaskID] = {}

    def measure(self, specs: Sequence[TargetSpec]) -> None:
        """Every round: each value size, each target in turn. Then, with --idle-partitions,
        the idle figures of each started target (a fresh broker each, after the rounds)."""
        s = self.settings
        self.measurements = [
            Measurement(spec.name, size, s.records[size])
            for spec in specs
            for size in s.value_sizes
        ]
        with ExitStack() as brokers:
            started = [self._start(spec, brokers) for spec in specs]
            live = [target for target in started if target is not None]
            # Rounds from 1 - warm_up_rounds to 0 warm up (a JVM's JIT compiles during its
            # first workloads); their figures are dropped.
            for number in range(1 - s.warm_up_rounds, s.rounds + 1):
                for size in s.value_sizes:
                    for target in live:
                        if not target.failed:
                            m = self._measurement(target, size)
                            if number < 1:
                                m = Measurement(m.target, m.value_size, m.records)
                            self._measure_round(target, m, number)
        if s.idle_partitions:
            for target in live:
                if target.spec.started_here and not target.failed:
                    self._measure_idle(target.spec)

    def _start(self, spec: TargetSpec, brokers: ExitStack) -> LiveTarget | None:
        """The target, connected (its broker started and left running in `brokers`)."""
        try:
            with ExitStack() as stack:
                bootstrap, broker = stack.enter_context(
                    target_broker(spec, self.progress.console, "throughput")
                )
                target = LiveTarget(spec, broker)
                stack.callback(target.disconnect)
                target.session = connect_admin(Cluster(bootstrap))
                brokers.enter_context(stack.pop_all())
                return target
        except (CliError, KafkaException) as exc:
            self._fail(spec.name, exc)
            return None

    def _measurement(self, target: LiveTarget, size: int) -> Measurement:
        return next(
            m for m in self.measurements if m.target == target.spec.name and m.value_size == size
        )

    def _fail(self, name: str, exc: CliError | KafkaException) -> None:
        """Report a failure; the target's measurements short of a round get it as error."""
        text = error_text(exc)
        note(f"{name}: {text}")
        for m in self.measurements:
            if m.target == name and len(m.consume_rounds) < self.settings.rounds:
                m.error = m.error or text

    def _measure_round(self, target: LiveTarget, m: Measurement, number: int) -> None:
        try:
            self._measure_one(target, m, number)
        except (CliError, KafkaException) as exc:
            target.failed = True
            self._fail(target.spec.name, exc)

    def _measure_one(self, target: LiveTarget, m: Measurement, number: int) -> None:
        """One round of one target and value size, on a topic of its own; a started broker's
        RSS is sampled during this workload only."""
        session, size = target.session, m.value_size
        assert session is not None
        sampler = RssSampler(target.broker.pid) if target.broker is not None else None
        try:
            if sampler is not None:
                sampler.sample()
            topic = f"onceflow-bench-{size}b-{secrets.token_hex(4)}"
            create_topic(session, topic, self.settings.partitions, self.settings.replication_factor)
            try:
                task = self._task(m, "produce", number, m.records)
                cpu = self._cpu(target)
                produced, reports = self._produce(session.bootstrap, topic, size, task)
                m.produce_rounds.append(produced)
                m.produce_costs.append(
                    BrokerCost(
                        produced.records,
                        self._cpu_since(target, cpu),
                        sum(r.produce_requests for r in reports),
                        [tuple(w) for r in reports for w in r.rtt_windows],
                    )
                )
                task = self._task(m, "consume", number, produced.records)
                cpu = self._cpu(target)
                consumed = self._consume(session.bootstrap, topic, produced.records, task)
                m.consume_rounds.append(consumed)
                m.consume_costs.append(BrokerCost(consumed.records, self._cpu_since(target, cpu)))
            finally:
                delete_topic(session, topic)
            if sampler is not None:
                sampler.sample()
            m.rss_rounds.append((sampler.max, sampler.last) if sampler else (None, None))
        finally:
            if sampler is not None:
                sampler.stop()

    def _task(self, m: Measurement, phase: str, number: int, total: int) -> TaskID:
        """One progress line per target, value size and phase, reset at each round."""
        rounds = self.settings.rounds
        label = f"{m.target} {size_text(m.value_size)}"
        description = f"{label} {phase}" if rounds == 1 else f"{label} {number}/{rounds} {phase}"
        if number < 1:
            description = f"{label} warm-up {phase}"
        key = (m.target, m.value_size, phase)
        return round_task(self.progress, self._tasks, key, description, total)

    @staticmethod
    def _cpu(target: LiveTarget) -> float | None:
        return cpu_seconds(target.broker.pid) if target.broker is not None else None

    def _cpu_since(self, target: LiveTarget, before: float | None) -> float | None:
        """CPU seconds a started broker used since `before` (None for one given by address).
        The phase's span holds the clients' connecting too: a few requests of thousands."""
        after = self._cpu(target)
        return None if before is None or after is None else after - before

    def _produce(
        self, bootstrap: str, topic: str, size: int, task: TaskID
    ) -> tuple[Phase, list[ProducerReport]]:
        total = self.settings.records[size]
        jobs = [
            ProducerJob(bootstrap, topic, share, size, self.settings.producer_settings, True)
            for share in split_records(total, self.settings.producers)
        ]
        reports = run_producer_processes(jobs, self.progress, task)
        return delivered_phase(reports, total, size), reports

    def _consume(self, bootstrap: str, topic: str, expected: int, task: TaskID) -> Phase:
        warm_ups = len(split_records(expected, self.settings.producers))  # one per producer process
        return consume_topic(
            bootstrap,
            topic,
            expected,
            self.settings.consumer_settings,
            self.progress,
            task,
            uncounted=warm_ups,
        )

    def _measure_idle(self, spec: TargetSpec) -> None:
        """RSS of a fresh broker, empty and then holding idle partitions."""
        count = self.settings.idle_partitions
        purpose = f"RSS with {count} idle partitions"
        try:
            with target_broker(spec, self.progress.console, purpose) as (bootstrap, broker):
                assert broker is not None
                session = connect_admin(Cluster(bootstrap))
                empty = settled_rss(broker)
                create_topic(session, f"onceflow-bench-idle-{secrets.token_hex(4)}", count, 1)
                idle = settled_rss(broker)
                # Disconnect before the broker stops: some brokers wait for clients to leave.
                del session
        except (CliError, KafkaException) as exc:
            self._fail(spec.name, exc)
            return
        self.idle.append(IdleMeasurement(spec.name, count, empty, idle))
