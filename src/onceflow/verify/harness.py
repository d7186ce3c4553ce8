"""One verify run: broker (embedded or not), proxy, clients, faults, final reads, checker.

1. Start the broker (embedded: a child process; for the disk fault its data on a small
   filesystem, or where none can be mounted a full disk simulated in its log layer; or with
   `apache_kafka`, an Apache Kafka cluster of N nodes on loopback, kafka_nodes.py) and, for
   the partition fault, the proxy (which rewrites the nodes' addresses in Metadata and
   FindCoordinator answers, so every connection of a client to any node goes through it).
2. Create the topics, start the clients (each its own process) and the nemesis.
3. At the deadline: heal, stop the nemesis, stop the clients (each finishes its operation).
4. Final reads, straight to the broker: read_committed and read_uncommitted passes over
   every partition to its high watermark (waiting for transactions left open by crashed
   clients to be aborted by the broker's transaction timeout), and the copiers' offsets.
5. Check the history.

The compacted workload (`workload="compacted"`) runs keyed transactional producers and readers
on one topic with `cleanup.policy=compact`, tiny segments and an eager cleaner, waits for a
cleaning round after the producers stop, and counts the cleaner's rounds on that topic from
the broker's log (one "cleaned T-P [..)" line a round).

The database workload (`workload="database"`) runs loaders instead of copiers: consumers in
the copiers' group that store the input into a SQL table, rows and positions in one database
transaction (database_workload.py); `sink_url` is the database (by default an SQLite file in the
run's directory). After the producers stop the harness waits for the positions to cover the
committed input, reads the table into the history, and database_check.py checks it.

With `mirror=True` (embedded only) a second embedded broker is the target of the mirror
pipeline, run as a supervised child process from the start of the workload (mirror_run.py);
`kill` kills either broker, `kill-mirror` the mirror's driver. At the end, after the source's
final reads, the harness waits for the mirror to catch up, reads the target read_committed and
checks that view against the source's (mirror_check.py).
"""

from __future__ import annotations

import dataclasses
import random
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.apache_kafka import Distribution
from onceflow.broker.embedded import EmbeddedBroker
from onceflow.sql.engine import DatabaseError, describe
from onceflow.sql.postgres_server import PostgresError, PostgresServer, binaries
from onceflow.verify.checker import CheckResult, check
from onceflow.verify.database_check import check_database
from onceflow.verify.database_workload import (
    ManagedDatabase,
    prepare_database,
    read_database,
    wait_stored,
)
from onceflow.verify.faults import (
    APACHE_KAFKA_ONLY,
    BROKER_ONLY,
    DISK,
    EMBEDDED_ONLY,
    KILL,
    KILL_MIRROR,
    LAGGING_FAILOVER,
    PARTITION,
    TARGET_BROKER,
    DiskUnavailableError,
    FaultError,
    Nemesis,
    SimulatedFullDisk,
    SmallDisk,
    SupervisedBroker,
    Targets,
)
from onceflow.verify.final_reads import final_offsets, final_pass, group_type, wait_drained
from onceflow.verify.history import (
    FAIL,
    INFO,
    INVOKE,
    NEMESIS,
    OK,
    POLL,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    TOPICS,
    TXN,
    UNKNOWN,
    History,
    Op,
)
from onceflow.verify.indexed_history import IndexedHistory
from onceflow.verify.java_worker import (
    JAVA,
    JAVA_ROLES,
    JavaWorker,
    compile_worker,
    java_client,
    version_2_evidence,
)
from onceflow.verify.kafka_nodes import ManagedKafka, WorkloadKeys, resolve_distribution
from onceflow.verify.mirror_check import MIRROR_READ, check_mirror, source_ops
from onceflow.verify.mirror_run import (
    SupervisedMirror,
    committed_ends,
    read_target,
    target_topic,
    wait_caught_up,
)
from onceflow.verify.proxy import KafkaProxy
from onceflow.verify.workers import COMMITTING, IN_TXN, MOMENTS, WorkerPool
from onceflow.verify.workload import (
    COPIER,
    LOADER,
    OFFSETS_READER,
    PRODUCER,
    READER,
    ClientCounts,
    WorkloadSpec,
)

# The broker aborts the transactions of crashed or paused clients quickly, so that the run
# sees fencing by timeout too; small segments exercise rolls and producer-state snapshots.
EMBEDDED_SETTINGS = {
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "group.initial.rebalance.delay.ms": "0",
    # KIP-848 copiers (--group-protocol consumer): the classic copiers' session and heartbeat.
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.heartbeat.interval.ms": "1000",
    "auto.create.topics.enable": "false",
    "log.segment.bytes": str(1 << 20),
}

DEFAULT, COMPACTED, DATABASE = "default", "compacted", "database"
WORKLOADS = (DEFAULT, COMPACTED, DATABASE)
DATABASE_FILE = "database.sqlite"  # the database workload's default: in the run's directory
# The compacted workload: a segment rolled every 16 KiB or 2 s and a cleaner that looks every
# 200 ms and cleans any dirt, so that it cleans many times during a run; tombstones (and the
# markers of cleaned-away transactions) may go 2 s after the first clean that saw them.
COMPACTED_TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.bytes": str(16 << 10),
    "segment.ms": "2000",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "2000",
}
COMPACTED_BROKER_SETTINGS = {"log.cleaner.backoff.ms": "200"}
KEYS_PER_PARTITION = 8  # per partition of the compacted topic: each overwritten often
TOMBSTONE_RATIO = 0.1
# For the mirror to copy what is left once the workload stops: at least this, or as long as
# the run (the workload writes faster than the mirror copies).
MIRROR_CATCH_UP_S = 300.0
CLEANED_LINE = re.compile(r"cleaned (\S+)-(\d+) \[(\d+), (\d+)\)")


class VerifyError(RuntimeError):
    """The run could not be carried out (not an anomaly: the harness or the setup failed)."""


# The disk fault's tmpfs per minute of run (over twice what a run with every fault wrote).
DISK_MB_PER_MINUTE = 32


@dataclass(frozen=True)
class VerifyOptions(ClientCounts):
    duration_s: float = 60.0
    faults: tuple[str, ...] = ()
    seed: int = 0
    bootstrap: str | None = None  # None: the embedded broker (or apache_kafka's cluster)
    # A managed Apache Kafka cluster instead: "fetched" or a distribution / libs/ directory,
    # with this many nodes and these settings over the exactly-once production ones.
    apache_kafka: str | None = None
    nodes: int = 3
    kafka_settings: tuple[tuple[str, str], ...] = ()
    work_dir: Path | None = None  # kept; by default a temporary one, kept only on anomalies
    disk_size_mb: int | None = None  # the disk fault's tmpfs; None: sized by the duration
    calm_s: tuple[float, float] = (1.0, 4.0)
    workload: str = DEFAULT  # or COMPACTED
    mirror: bool = False  # a target broker and the mirror pipeline (embedded only)
    sink_url: str | None = None  # the database workload's database [SQLite in work_dir]
    postgres: bool = False  # the database workload: a PostgreSQL server of its own, killed
    client: str = "python"  # or "java": the producers and copiers in Kafka's Java client

    @property
    def embedded(self) -> bool:
        return self.bootstrap is None and self.apache_kafka is None

    @property
    def disk_mb(self) -> int:
        """The disk fault's filesystem: room for the whole run's data (the checker reads it all
        back, so nothing may be deleted), about 13 MB a minute with every fault; a fixed 256 MB
        filled up after 20 minutes and the broker could no longer start."""
        if self.disk_size_mb is not None:
            return self.disk_size_mb
        return max(256, int(self.duration_s / 60 * DISK_MB_PER_MINUTE))

    @property
    def managed(self) -> bool:
        """A broker the run starts and faults: the embedded one or an Apache Kafka cluster."""
        return self.bootstrap is None


@dataclass
class Progress:
    phase: str
    elapsed_s: float
    duration_s: float
    operations: int = 0
    committed: int = 0
    aborted: int = 0
    unknown: int = 0
    records_read: int = 0
    faults: int = 0
    current_fault: str | None = None


@dataclass
class VerifyRun:
    options: VerifyOptions
    result: CheckResult
    work_dir: Path
    history_path: Path
    elapsed_s: float
    faults_injected: dict[str, int]
    unavailable: dict[str, str]  # fault -> why it could not be used
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    history: list[Op] = field(default_factory=list)  # what the timeline report is drawn from

    @property
    def ok(self) -> bool:
        return self.result.valid and not self.errors


class _Tally:
    """Running figures for the progress line, read incrementally from the history."""

    def __init__(self, history: History) -> None:
        self.history, self.seen = history, 0
        self.counts: Counter[str] = Counter()

    def update(self) -> Counter[str]:
        ops = self.history.ops
        end = len(ops)
        for op in ops[self.seen : end]:
            if op.f == TXN and op.type != INVOKE:
                self.counts[op.type] += 1
            elif op.f == POLL and op.type == OK:
                self.counts["records"] += len(op.value.get("records", []))
            elif op.process == NEMESIS and op.type == INVOKE:
                self.counts["faults"] += 1
        self.seen = end
        return self.counts


def run_verify(
    options: VerifyOptions, progress: Callable[[Progress], None] | None = None
) -> VerifyRun:
    report = progress or (lambda p: None)
    if options.workload not in WORKLOADS:
        raise VerifyError(f"unknown workload {options.workload!r}: one of {WORKLOADS}")
    compacted = options.workload == COMPACTED
    if compacted:  # keyed producers and readers only: no copiers on a compacted input
        options = dataclasses.replace(options, copiers=0)
    # The database workload: as many loaders (into the database) as copiers were asked for.
    loaders = options.copiers if options.workload == DATABASE else 0
    if loaders:
        options = dataclasses.replace(options, copiers=0)
    if (options.sink_url is not None or options.postgres) and options.workload != DATABASE:
        raise VerifyError("a sink URL or a PostgreSQL server needs the database workload")
    if loaders and options.group_protocol != "classic":
        # DatabaseConsumer assigns in its rebalance callback: the classic, eager protocol
        raise VerifyError("the database workload's loaders use the classic group protocol")
    if options.sink_url is not None and options.postgres:
        raise VerifyError("a sink URL, or a PostgreSQL server of the run's: not both")
    distribution = None
    if options.apache_kafka is not None:  # before anything is made: a wrong DIR is a usage error
        try:
            distribution = resolve_distribution(options.apache_kafka)
        except (ValueError, RuntimeError) as e:  # no such distribution, no java, no mvn
            raise VerifyError(f"cannot run Apache Kafka: {e}") from e
    java: Distribution | None = None
    if options.client == JAVA:
        try:
            java = java_client()
        except (ValueError, RuntimeError) as e:  # no java, no mvn, a fetch that failed
            raise VerifyError(f"cannot run the Java client: {e}") from e
    started = time.monotonic()
    temporary = options.work_dir is None
    work_dir = options.work_dir or Path(tempfile.mkdtemp(prefix="onceflow-verify-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    logs = work_dir / "logs"
    logs.mkdir(exist_ok=True)
    history_path = work_dir / "history.jsonl"
    history = History(history_path, start=started)
    rng = random.Random(options.seed)
    tag = secrets.token_hex(3)
    notes: list[str] = []
    errors: list[str] = []
    kinds, unavailable = usable_faults(options)
    if options.mirror and not options.embedded:
        raise VerifyError("--mirror needs --embedded")
    if KILL_MIRROR in kinds and not options.mirror:
        unavailable[KILL_MIRROR] = "needs --mirror"
        kinds.remove(KILL_MIRROR)

    disk: SmallDisk | SimulatedFullDisk | None = None
    broker: SupervisedBroker | None = None
    proxy: KafkaProxy | None = None
    pool: WorkerPool | None = None
    java_worker: JavaWorker | None = None
    nemesis: Nemesis | None = None
    broker_log: Path | None = None  # the embedded broker's whole output
    target: SupervisedBroker | None = None
    mirror: SupervisedMirror | None = None
    kafka: ManagedKafka | None = None
    postgres: PostgresServer | None = None
    details: dict[str, Any] = {"topic_tag": tag}
    try:
        if java is not None:
            report(Progress("compiling the Java worker", 0, options.duration_s))
            try:
                java_worker = compile_worker(java, work_dir / "java")
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                raise VerifyError(f"cannot run the Java client: {e}") from e
        if options.embedded:
            broker_env: dict[str, str] = {}
            data_dir = work_dir / "data"
            if DISK in kinds:
                try:
                    disk = SmallDisk.mount(work_dir / "disk", options.disk_mb)
                    data_dir = disk.path / "data"
                except DiskUnavailableError as e:
                    disk = SimulatedFullDisk(work_dir / "full-disk.flag")
                    broker_env = disk.broker_env
                    details["disk"] = f"simulated in the log layer ({e})"
            settings = {**EMBEDDED_SETTINGS, **(COMPACTED_BROKER_SETTINGS if compacted else {})}
            report(Progress("starting broker", 0, options.duration_s))
            broker = _broker(data_dir, settings, broker_env, logs, "broker", history)
            broker_log = broker.broker.log_file
            bootstrap = broker.bootstrap
            if options.mirror:
                report(Progress("starting target broker", 0, options.duration_s))
                target = _broker(
                    work_dir / "target-data", settings, {}, logs, "target-broker", history
                )
        elif distribution is not None:
            kafka = _apache_kafka(
                options, distribution, work_dir, details, links=LAGGING_FAILOVER in kinds
            )
            report(Progress(f"starting Apache Kafka {kafka.version}", 0, options.duration_s))
            kafka.start()
            bootstrap = kafka.bootstrap
        else:
            assert options.bootstrap is not None
            bootstrap = options.bootstrap
        topics = (
            {f"verify-{tag}-kv": 3} if compacted else {f"verify-{tag}-a": 3, f"verify-{tag}-b": 2}
        )
        if loaders and options.postgres:
            report(Progress("starting PostgreSQL", 0, options.duration_s))
            postgres = _postgres()
        workload = WorkloadSpec(
            topics=topics,
            copy_output=f"verify-{tag}-copy",
            copy_output_partitions=2,
            copy_group=f"verify-{tag}-copiers",
            producers=options.producers,
            copiers=options.copiers,
            committed_readers=options.committed_readers,
            uncommitted_readers=options.uncommitted_readers,
            transaction_timeout_ms=options.transaction_timeout_ms,
            group_protocol=options.group_protocol,
            keys_per_partition=KEYS_PER_PARTITION if compacted else 0,
            tombstone_ratio=TOMBSTONE_RATIO if compacted else 0.0,
            sink_url=_sink_url(options, work_dir, postgres),
            sink_table=f"verify_{tag}" if loaders else "",
        )
        if loaders:
            details["database"] = {"url": describe(workload.sink_url), "table": workload.sink_table}
            try:
                prepare_database(workload.sink_url, workload.sink_table)
            except DatabaseError as e:
                raise VerifyError(str(e)) from e
        configs = dict.fromkeys(workload.topics, COMPACTED_TOPIC_CONFIGS if compacted else {})
        configs[workload.copy_output] = {}
        details["topics"] = {**workload.topics, workload.copy_output: 2}
        details["group"] = workload.copy_group
        report(Progress("creating topics", time.monotonic() - started, options.duration_s))
        create_topics(bootstrap, {**workload.topics, workload.copy_output: 2}, configs)
        created = {
            name: {"partitions": n, "configs": configs[name]}
            for name, n in details["topics"].items()
        }
        history.append("harness", INFO, TOPICS, {"topics": created})

        if target is not None:
            mirror = SupervisedMirror(
                bootstrap,
                target.bootstrap,
                f"verify-{tag}-.*",
                work_dir,
                history,
                max(20_000, options.transaction_timeout_ms),
            )
            mirror.start()
        if PARTITION in kinds:
            proxy = KafkaProxy().start()
        route = proxy
        pool = WorkerPool(
            history,
            workload,
            options.seed,
            logs,
            (lambda name: route.bootstrap_for(name, bootstrap)) if route else lambda _: bootstrap,
            java=java_worker,
        )
        for slot in range(options.producers):
            pool.add(PRODUCER, slot)
        for slot in range(options.copiers):
            pool.add(COPIER, slot)
        for slot in range(options.committed_readers):
            pool.add(READER, slot, READ_COMMITTED)
        for slot in range(options.uncommitted_readers):
            pool.add(READER, slot, READ_UNCOMMITTED)
        for slot in range(loaders):
            pool.add(LOADER, slot)
        if options.copiers:
            pool.add(OFFSETS_READER, 0)
        if kafka is not None:  # a writer's slot name is its transactional.id
            group = workload.copy_group if options.copiers else None
            writers = pool.names((PRODUCER, COPIER))
            kafka.serve(
                WorkloadKeys(workload.all_partitions(), writers, group, workload.data_partitions())
            )
        pool.start_all()

        nemesis = Nemesis(
            tuple(kinds),
            Targets(
                broker,
                pool,
                proxy,
                disk,
                mirror,
                target,
                # the database workload's subject: its loaders are paused and killed most
                (LOADER,) if loaders else (PRODUCER, COPIER),
                kafka,
                moments=(IN_TXN, COMMITTING) if loaders else MOMENTS,
                database=ManagedDatabase(postgres) if postgres else None,
            ),
            history,
            rng,
            calm=options.calm_s,
            scale=options.transaction_timeout_ms / 10_000,
        )
        nemesis.start()
        tally = _Tally(history)
        run_started = time.monotonic()
        while (elapsed := time.monotonic() - run_started) < options.duration_s:
            time.sleep(min(1.0, max(0.05, options.duration_s - elapsed)))
            counts = tally.update()
            report(
                Progress(
                    "running",
                    time.monotonic() - run_started,
                    options.duration_s,
                    len(history),
                    counts[OK],
                    counts[FAIL],
                    counts[UNKNOWN],
                    counts["records"],
                    counts["faults"],
                    nemesis.current,
                )
            )
            if nemesis.error is not None:
                errors.append(f"fault injection failed: {nemesis.error}")
                break
            if mirror is not None and mirror.failure is not None:
                errors.append(mirror.failure)  # nothing more to learn from the rest of the run
                break
        report(Progress("healing", time.monotonic() - run_started, options.duration_s))
        nemesis.stop()
        if nemesis.error is not None and not errors:
            errors.append(f"fault injection failed: {nemesis.error}")
        if proxy is not None:
            proxy.heal()
        report(Progress("stopping clients", time.monotonic() - run_started, options.duration_s))
        stop_s = 3 * options.transaction_timeout_ms / 1000 + 10
        killed = pool.stop(timeout=stop_s, roles=(PRODUCER,))
        if compacted and broker_log is not None:
            # So that the final reads see a log cleaned after the last write.
            report(Progress("cleaning", time.monotonic() - run_started, options.duration_s))
            details["cleaned_after_stop"] = wait_cleaned(broker_log, set(topics), 15.0)
        if options.copiers:
            # As Kafka's system test: the copiers copy the whole input before they stop, so
            # that the check "committed input = committed output" covers all of it.
            report(Progress("copiers draining", time.monotonic() - run_started, options.duration_s))
            drained = wait_drained(bootstrap, workload, max(60.0, 4 * stop_s), tag)
            details["copiers_drained"] = drained
            if not drained:
                notes.append("the copiers did not copy all the input before the deadline")
        if loaders:
            report(Progress("loaders draining", time.monotonic() - run_started, options.duration_s))
            stored = wait_stored(bootstrap, workload, max(60.0, 4 * stop_s), tag)
            details["loaders_drained"] = stored
            if not stored:
                errors.append("the loaders did not store all the input before the deadline")
        killed += pool.stop(timeout=stop_s)
        if killed:
            notes.append(f"clients killed at the end (did not stop in time): {killed}")
        details["unexpected_client_exits"] = pool.unexpected_exits
        details["torn_lines"] = pool.torn_lines
        if proxy is not None:
            details["proxy"] = vars(proxy.stats)
        if compacted and broker_log is not None:
            details["cleaner_rounds"] = cleaner_rounds(broker_log, set(topics))
        if broker is not None:
            details["broker_exits"] = broker.exits  # halts on a full disk, say
            details["broker_restarts"] = broker.restarts
        cluster_up = kafka is None or _kafka_end(kafka, details, errors)
        if broker is not None and not broker.running():
            errors.append("the broker is not running at the end of the run")
        elif cluster_up:
            report(Progress("final reads", time.monotonic() - run_started, options.duration_s))
            settle_s = max(60.0, 3 * options.transaction_timeout_ms / 1000 + 30)
            for isolation in (READ_COMMITTED, READ_UNCOMMITTED):
                final_pass(bootstrap, workload, isolation, history, settle_s, tag)
            final_offsets(bootstrap, workload, history)
            if options.copiers:
                # The protocol the copiers' group really runs, as the broker lists it.
                kind = group_type(bootstrap, workload.copy_group)
                details["copy_group_type"] = kind
                if kind != options.group_protocol:
                    errors.append(
                        f"the copiers' group is listed as {kind}, not {options.group_protocol}"
                    )
            if java is not None:
                details["java_client"] = _java_evidence(java, bootstrap, history, pool, notes)
            if loaders:
                read_database(workload, history)
            if mirror is not None and target is not None:
                caught_up = mirror.failure is None and _mirror_finish(
                    max(MIRROR_CATCH_UP_S, options.duration_s),
                    mirror,
                    target,
                    workload,
                    history,
                    tag,
                    details,
                    lambda name: report(
                        Progress(name, time.monotonic() - run_started, options.duration_s)
                    ),
                )
                if mirror.failure is not None:
                    if mirror.failure not in errors:  # given up on after the running
                        errors.append(mirror.failure)
                elif not caught_up:
                    errors.append("the mirror did not catch up before the deadline")
        report(Progress("checking", time.monotonic() - run_started, options.duration_s))
        history.close()
        check_started = time.monotonic()
        result = check(
            source_ops(history.ops),
            lambda step: report(
                Progress(f"checking: {step}", time.monotonic() - run_started, options.duration_s)
            ),
        )
        details["check_s"] = round(time.monotonic() - check_started, 2)
        details["run_s"] = round(check_started - started, 2)
        if mirror is not None and mirror.failure is None:  # else no target read to check
            result.anomalies.extend(check_mirror(history.ops, target_topic))
        if loaders:
            found, figures = check_database(source_ops(history.ops))
            result.anomalies.extend(found)
            result.stats.update(figures)
            if not figures.get("database_read", True):
                errors.append("the database could not be read at the end")
        # A run where nothing got through proves nothing: that is a failure, not a pass.
        if options.producers and not result.stats["committed"]:
            errors.append("no transaction committed: the workload made no progress")
        if not result.stats["polls_records"]:
            errors.append("no consumer read anything: the workload made no progress")
        faults_injected = dict(nemesis.injected)
    finally:
        if nemesis is not None:
            nemesis.stop()
        if pool is not None:
            pool.stop(timeout=5)
        if proxy is not None:
            proxy.close()
        if mirror is not None:
            mirror.stop()
        if kafka is not None:
            kafka.stop()
        if postgres is not None:
            postgres.close()
        for name, supervised in (("broker", broker), ("target broker", target)):
            if supervised is not None and supervised.stop() not in (0, None):
                notes.append(f"the {name} did not shut down cleanly")
        if disk is not None:
            disk.unmount()
        history.close()
    run = VerifyRun(
        options,
        result,
        work_dir,
        history_path,
        time.monotonic() - started,
        faults_injected,
        unavailable,
        notes,
        errors,
        details,
        source_ops(history.ops),
    )
    if temporary and run.ok:
        shutil.rmtree(work_dir, ignore_errors=True)
    return run


def _java_evidence(
    java: Distribution, bootstrap: str, history: History, pool: WorkerPool, notes: list[str]
) -> dict[str, Any]:
    """The Java client's release, and each writer's epoch against the transactions it ended:
    transactions version 2 bumps the epoch at every end."""
    evidence = version_2_evidence(bootstrap, history.ops, pool.names(JAVA_ROLES))
    if not evidence.get("version_2"):
        notes.append(f"the Java client's epochs do not show transactions version 2: {evidence}")
    return {"kafka": java.version, **evidence}


def _postgres() -> PostgresServer:
    """The database workload's own PostgreSQL server (options.postgres), started."""
    try:
        return PostgresServer(binaries()).start()
    except (PostgresError, OSError, subprocess.CalledProcessError) as e:
        raise VerifyError(f"cannot start PostgreSQL: {e}") from e


def _sink_url(options: VerifyOptions, work_dir: Path, postgres: PostgresServer | None) -> str:
    """The database workload's database: given, the run's PostgreSQL, or an SQLite file."""
    if options.workload != DATABASE:
        return ""
    if postgres is not None:
        return postgres.new_database("verify")
    return options.sink_url or f"sqlite:///{work_dir.resolve() / DATABASE_FILE}"


def usable_faults(options: VerifyOptions) -> tuple[list[str], dict[str, str]]:
    """The fault kinds that apply to the run's target, and why each other one does not."""
    unavailable: dict[str, str] = {}
    kinds = list(options.faults)
    if not options.managed:
        for kind in BROKER_ONLY & set(kinds):
            unavailable[kind] = (
                "needs --apache-kafka"
                if kind in APACHE_KAFKA_ONLY
                else "needs the embedded broker or --apache-kafka"
            )
        kinds = [k for k in kinds if k not in BROKER_ONLY]
    elif not options.embedded:
        for kind in EMBEDDED_ONLY & set(kinds):
            unavailable[kind] = "does not apply to Apache Kafka"
        if LAGGING_FAILOVER in kinds and options.nodes < 2:
            unavailable[LAGGING_FAILOVER] = "needs 2 or more nodes (followers to lag)"
        kinds = [k for k in kinds if k not in EMBEDDED_ONLY and k not in unavailable]
    else:
        for kind in APACHE_KAFKA_ONLY & set(kinds):
            unavailable[kind] = "does not apply to the embedded broker (no followers)"
        kinds = [k for k in kinds if k not in APACHE_KAFKA_ONLY]
    return kinds, unavailable


def _broker(
    data_dir: Path,
    settings: dict[str, str],
    env: dict[str, str],
    logs: Path,
    name: str,
    history: History,
) -> SupervisedBroker:
    """An embedded broker, started and supervised, its whole output in `logs/<name>.log`."""
    embedded = EmbeddedBroker(
        data_dir, settings=settings, log_level="INFO", env=env, log_file=logs / f"{name}.log"
    )
    broker = SupervisedBroker(embedded, history, name)
    broker.start()
    return broker


def _apache_kafka(
    options: VerifyOptions,
    distribution: Distribution,
    work_dir: Path,
    details: dict[str, Any],
    links: bool = False,
) -> ManagedKafka:
    """The run's Apache Kafka cluster (not started), its data and logs in work_dir/kafka;
    with `links` its nodes replicate through relays that can be cut (lagging-failover)."""
    kafka = ManagedKafka(
        work_dir / "kafka", options.nodes, distribution, dict(options.kafka_settings), links
    )
    details["apache_kafka"] = {
        "version": kafka.version,
        "nodes": options.nodes,
        "settings": kafka.settings,
    }
    return kafka


def _kafka_end(kafka: ManagedKafka, details: dict[str, Any], errors: list[str]) -> bool:
    """After the faults: which nodes were chosen for what, and every node up again for the
    final reads (a node that died without a fault is an error of the run); False if the
    cluster does not come back."""
    details["node_faults"] = kafka.roles_chosen()
    if kafka.failovers:
        details["lagging_failovers"] = kafka.failover_outcomes()
    exited = kafka.exited_on_their_own()
    if exited:
        details["node_exits"] = exited
        errors.append(f"Apache Kafka nodes exited on their own (node: code): {exited}")
    try:
        kafka.ensure_running()
    except FaultError as e:
        errors.append(str(e))
        return False
    return True


def _mirror_finish(
    timeout_s: float,
    mirror: SupervisedMirror,
    target: SupervisedBroker,
    workload: WorkloadSpec,
    history: History,
    tag: str,
    details: dict[str, Any],
    phase: Callable[[str], None],
) -> bool:
    """After the source's final reads: wait for the mirror to copy everything the source
    committed, then read the target read_committed (False if it did not catch up in time)."""
    source = IndexedHistory(source_ops(history.ops))
    source.final_passes()
    final = source.finals.get(READ_COMMITTED)
    ends = committed_ends(final.at if final else {})

    def shown(behind: int, partitions: int) -> None:
        phase(f"mirror catching up: {behind} of {partitions} partitions behind")

    caught_up = wait_caught_up(
        target.bootstrap, ends, timeout_s, shown, lambda: mirror.failure is not None
    )
    details["mirror_caught_up"] = caught_up
    details["mirror_exits"], details["mirror_restarts"] = mirror.exits, mirror.restarts
    details["target_broker_restarts"] = target.restarts
    if mirror.failure is not None:
        return False
    phase("target final read")
    read_target(target.bootstrap, workload, history, 60.0, tag)
    details["mirror_values"] = sum(
        len(op.value.get("records", []))
        for op in history.ops
        if op.process == MIRROR_READ and op.f == POLL and op.type == OK
    )
    details["target_kills"] = sum(
        op.f == KILL and op.type == OK and op.value.get("target") == TARGET_BROKER
        for op in history.ops
        if op.process == NEMESIS
    )
    return caught_up


def cleaner_rounds(broker_log: Path, topics: set[str]) -> int:
    """How many cleaning rounds the broker logged for these topics' partitions."""
    rounds = 0
    with broker_log.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            match = CLEANED_LINE.search(line)
            rounds += match is not None and match.group(1) in topics
    return rounds


def wait_cleaned(broker_log: Path, topics: set[str], timeout_s: float) -> bool:
    """Wait for one more cleaning round of these topics (False if none came: nothing was
    left to clean, or the cleaner is late)."""
    before = cleaner_rounds(broker_log, topics)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if cleaner_rounds(broker_log, topics) > before:
            return True
    return False


def create_topics(
    bootstrap: str, topics: dict[str, int], configs: dict[str, dict[str, str]] | None = None
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    futures = admin.create_topics(
        [NewTopic(name, n, -1, config=(configs or {}).get(name, {})) for name, n in topics.items()]
    )
    for name, future in futures.items():
        try:
            future.result(timeout=30)
        except KafkaException as e:
            raise VerifyError(f"cannot create topic {name}: {e.args[0]}") from e
    deadline = time.monotonic() + 30
    while True:  # metadata may lag creation on a real cluster
        metadata = admin.list_topics(timeout=10)
        if all(
            name in metadata.topics and len(metadata.topics[name].partitions) == n
            for name, n in topics.items()
        ):
            return
        if time.monotonic() > deadline:
            raise VerifyError(f"topics {sorted(topics)} not all visible after 30 s")
        time.sleep(0.2)
