"""The producing workload: one or more producer processes, started together.

Each producer runs in its own Python process (so the client is not the only bottleneck) and
counts delivery reports; the benchmark adds up what they delivered in the time from the
first start to the last finish.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer
from rich.progress import Progress, TaskID

from onceflow.bench.client_stats import ClientStats
from onceflow.bench.errors import STALL_TIMEOUT_S, BenchError
from onceflow.bench.stats import Phase
from onceflow.bench.targets import BROKER_READY_TIMEOUT_S
from onceflow.tools.clients import REQUEST_TIMEOUT_S, ClientErrors, Cluster, client_config, drain
from onceflow.tools.errors import CliError, error_text, kafka_error_text

# Producer settings for throughput with Kafka's durability defaults (acks=all, idempotence).
PRODUCER_SETTINGS: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 5,
    # Batches are bounded by bytes (1 MB, the default max message size), not by count.
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "compression.type": "none",
}

PRODUCER_WORKER = "producer-worker"
PRODUCER_MODULE = "onceflow.bench.producers"
PROGRESS_EVERY = 8192


@dataclass(frozen=True)
class ProducerJob:
    """What one producer process sends; it travels to the process as a JSON line."""

    bootstrap: str
    topic: str
    records: int
    value_size: int
    settings: dict[str, Any]
    # One record delivered before "ready", so an idempotent producer has its id before the
    # clock runs (librdkafka may wait 500 ms to ask for it); the record is not counted.
    warm_up: bool = False


@dataclass
class ProducerReport:
    delivered: int = 0
    failed: int = 0
    first_error: str | None = None
    started: float = 0.0
    finished: float = 0.0
    crashed: str | None = None
    # From librdkafka's statistics: Produce requests sent (the warm-up's too) and the round
    # trips of each window on the clock, as (requests, p50 us, p99 us).
    produce_requests: int = 0
    rtt_windows: list[tuple[int, float, float]] = field(default_factory=list)

    def add_stats(self, stats: ClientStats) -> None:
        self.produce_requests = stats.produce_requests
        self.rtt_windows = list(stats.windows)

    def count(self, error: KafkaError | None) -> bool:
        """Count one delivery report; True when the record was delivered."""
        if error is None:
            self.delivered += 1
            return True
        self.failed += 1
        if self.first_error is None:
            self.first_error = kafka_error_text(error)
        return False


class ProducerProcess:
    """A producer in its own Python process, so the client is not the only bottleneck.

    Runs `python -m MODULE producer-worker` (MODULE is onceflow.bench.producers unless a
    benchmark brings its own worker) and talks one line at a time: the job (JSON) in,
    "ready" out once connected, "go" in, "progress N" out now and then, and finally
    "report {...}" out, read as `report_type`. time.monotonic() is system-wide on Linux,
    so the start and finish times of all producers can be compared.
    """

    def __init__(
        self,
        job: ProducerJob,
        module: str = PRODUCER_MODULE,
        report_type: type[ProducerReport] = ProducerReport,
    ) -> None:
        self._report_type = report_type
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, PRODUCER_WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(asdict(job)) + "\n")
        self.process.stdin.flush()
        self.ready = threading.Event()
        self.delivered = 0
        self.report: ProducerReport | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            word, _, rest = line.strip().partition(" ")
            if word == "ready":
                self.ready.set()
            elif word == "progress":
                self.delivered = int(rest)
            elif word == "report":
                self.report = self._report_type(**json.loads(rest))
                self.delivered = self.report.delivered

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def finished(self) -> bool:
        """True once the report arrived (or the process ended without one)."""
        if self.process.poll() is not None:
            self._reader.join(2.0)
            return True
        return self.report is not None

    def failure(self) -> str | None:
        """Why this producer did not deliver its job, if it did not."""
        if self.report is not None:
            return self.report.crashed
        if self.process.poll() is None:
            return None
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        last = lines[-1] if lines else "no output"
        return f"producer process exited with code {self.process.returncode}: {last}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self._reader.join(2.0)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with suppress(OSError):
                    stream.close()
        self._stderr.close()


Job = TypeVar("Job", bound=ProducerJob)
Report = TypeVar("Report", bound=ProducerReport)


def serve_job(
    job_type: type[Job], report_type: type[Report], produce: Callable[[Job, Report], None]
) -> int:
    """A producer process's life (see ProducerProcess): read the job, produce, report."""
    job = job_type(**json.loads(sys.stdin.readline()))
    report = report_type()
    try:
        produce(job, report)
    except (KafkaException, CliError, OSError) as exc:
        report.crashed = error_text(exc)
    print("report " + json.dumps(asdict(report)), flush=True)
    return 0


def await_go() -> None:
    """Say "ready" and wait for "go": every producer process starts the clock together."""
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise BenchError("the start signal never came")


def worker_entry(module: str, command: str, main: Callable[[], int]) -> NoReturn:
    """`python -m MODULE producer-worker`: run by `onceflow COMMAND`, never by hand."""
    if sys.argv[1:] != [PRODUCER_WORKER]:
        sys.exit(f"usage: python -m {module} {PRODUCER_WORKER} (run by onceflow {command})")
    sys.exit(main())


def producer_worker_main() -> int:
    """Entry point of a producer process."""
    return serve_job(ProducerJob, ProducerReport, _produce_records)


def _produce_records(job: ProducerJob, report: ProducerReport) -> None:
    def on_delivery(error: KafkaError | None, _message: object) -> None:
        report.count(error)

    errors = ClientErrors()
    stats = ClientStats()
    config = {**job.settings, **stats.settings(), "on_delivery": on_delivery}
    producer = Producer(client_config(Cluster(job.bootstrap), errors, config))
    producer.list_topics(job.topic, timeout=REQUEST_TIMEOUT_S)  # connect before the clock runs
    if job.warm_up:
        _warm_up(producer, job.topic, report)
    payload = os.urandom(job.value_size)
    await_go()
    produce, poll = producer.produce, producer.poll
    report.started = time.monotonic()
    stats.start()
    for i in range(job.records):
        while True:
            try:
                produce(job.topic, payload)
                break
            except BufferError:
                poll(0.005)  # local queue full: serve deliveries, then retry
        if i & 1023 == 0:
            poll(0)
            if i % PROGRESS_EVERY == 0:
                print(f"progress {report.delivered}", flush=True)
    pending = drain(producer, STALL_TIMEOUT_S)
    report.finished = time.monotonic()
    stats.final(producer.poll)  # off the clock
    report.add_stats(stats)
    if pending:
        report.failed += pending
        report.first_error = report.first_error or f"{pending} records still pending at the end"
    errors.raise_if_fatal()


def _warm_up(producer: Producer, topic: str, report: ProducerReport) -> None:
    producer.produce(topic, b"")
    pending = drain(producer, STALL_TIMEOUT_S)
    if pending or report.failed:
        raise BenchError(f"the warm-up record was not delivered: {report.first_error or 'timeout'}")
    report.delivered = 0


def run_producer_processes(
    jobs: list[ProducerJob],
    progress: Progress,
    task: TaskID,
    module: str = PRODUCER_MODULE,
    report_type: type[ProducerReport] = ProducerReport,
) -> list[ProducerReport]:
    """Run one producer process per job, started together once all are connected.

    Progress (delivered records) goes to `task`; a producer that fails, or no progress for
    STALL_TIMEOUT_S, is a BenchError. Returns the reports of the producers that sent one.
    """
    workers: list[ProducerProcess] = []
    try:
        for job in jobs:
            workers.append(ProducerProcess(job, module, report_type))
        _wait_all_ready(workers)
        for worker in workers:
            worker.go()
        _await_producers(workers, progress, task)
    finally:
        for worker in workers:
            worker.stop()
    return [worker.report for worker in workers if worker.report is not None]


def delivered_phase(reports: list[ProducerReport], total: int, size: int) -> Phase:
    """The produce figures of a run, or BenchError unless every record was delivered."""
    delivered = sum(report.delivered for report in reports)
    if delivered != total:
        first = next((r.first_error for r in reports if r.first_error), "unknown")
        raise BenchError(f"{total - delivered} of {total} records were not delivered: {first}")
    seconds = max(r.finished for r in reports) - min(r.started for r in reports)
    return Phase(delivered, delivered * size, seconds)


def _await_producers(workers: list[ProducerProcess], progress: Progress, task: TaskID) -> None:
    last_progress, last_change = -1, time.monotonic()
    while True:
        finished = all(worker.finished() for worker in workers)
        failures = [failure for worker in workers if (failure := worker.failure())]
        if failures:
            raise BenchError(f"a producer failed: {failures[0]}")
        done = sum(worker.delivered for worker in workers)
        progress.update(task, completed=done)
        if finished:
            return
        if done != last_progress:
            last_progress, last_change = done, time.monotonic()
        elif time.monotonic() - last_change > STALL_TIMEOUT_S:
            raise BenchError(f"producing stalled at {done} records")
        time.sleep(0.1)


def split_records(total: int, parts: int) -> list[int]:
    """`total` records shared between `parts` producers (none gets zero)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts) if base or i < extra]


def _wait_all_ready(workers: list[ProducerProcess]) -> None:
    deadline = time.monotonic() + BROKER_READY_TIMEOUT_S
    for worker in workers:
        while not worker.ready.wait(0.1):
            failure = worker.failure()
            if failure is not None:
                raise BenchError(f"a producer failed: {failure}")
            if time.monotonic() >= deadline:
                raise BenchError("producer processes did not connect in time")


if __name__ == "__main__":
    worker_entry(PRODUCER_MODULE, "bench", producer_worker_main)
