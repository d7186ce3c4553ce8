"""`onceflow bench-eos`'s run: what exactly-once costs, measured in one run.

For each target: producer throughput of plain (acks=all), idempotent and transactional
producers (a commit every --commit-interval-ms), consumer throughput of read_committed and
read_uncommitted over one topic written by the transactional producers (with some of their
transactions aborted), and how long a commit takes.
"""

from __future__ import annotations

import secrets
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
    delivered_phase,
    run_producer_processes,
    split_records,
)
from onceflow.bench.progress import round_task
from onceflow.bench.stats import Phase
from onceflow.bench.targets import TargetSpec, onceflow_launcher, parse_target, target_broker
from onceflow.bench.topics import create_topic, delete_topic
from onceflow.bench.workload import shape_checks
from onceflow.cli.clients import connect_admin
from onceflow.cli.errors import CliError, UsageError, error_text
from onceflow.cli.options import require_at_least
from onceflow.cli.output import note

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

    def check(self) -> None:
        """UsageError for a figure out of range."""
        require_at_least(
            *shape_checks(self.producers, self.partitions, self.replication_factor, self.rounds),
            ("--records", self.records, 1),
            ("--value-size", self.value_size, 1),
            ("--commit-interval-ms", self.commit_interval_ms, 1),
        )
        if not 0 <= self.abort_ratio < 1:
            raise UsageError(
                f"--abort-ratio must be at least 0 and below 1, not {self.abort_ratio:g}."
            )


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
            text = error_text(exc)
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
        round_task(self.progress, tasks, kind, description, total)

    def _produce(
        self, bootstrap: str, topic: str, mode: str, task: TaskID, m: EosMeasurement
    ) -> tuple[Phase, int]:
        """One round of one producer kind: its figures and how many records it committed."""
        s = self.settings
        config = {**s.producer_settings, **MODE_SETTINGS[mode]}
        shares = split_records(s.records, s.producers)
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


def eos_targets(addresses: list[str], embedded: bool) -> list[TargetSpec]:
    """The given addresses, then (with --embedded, or when none is given) an onceflow broker."""
    specs = [parse_target(address) for address in addresses]
    if embedded or not specs:
        specs.append(TargetSpec("onceflow (fsync)", launch=onceflow_launcher(fsync=True)))
    return specs
