"""`onceflow demo`: exactly-once word count on PySpark, through crashes, next to at-least-once.

On an embedded broker in a temporary directory: produce sentences, run the streaming word
count with the exactly-once sink, SIGKILL the driver right after it wrote a micro-batch (before
Spark's commit log records it), SIGKILL the broker while the restarted pipeline runs, restart
both, and compare the counts a read_committed reader ends with against the true counts. Then
the same job, same faults, with a plain at-least-once sink.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.table import Table

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.pipelines import CRASH_AFTER_BATCH_ENV
from onceflow.pipelines.topic_reader import read_topic
from onceflow.pipelines.wordcount_check import CountReport, check_counts, words_of
from onceflow.tools.clients import ClientErrors, Cluster, client_config

VOCABULARY = (
    "exactly",
    "once",
    "streaming",
    "kafka",
    "spark",
    "broker",
    "producer",
    "consumer",
    "transaction",
    "commit",
    "abort",
    "offset",
    "partition",
    "record",
    "batch",
    "marker",
    "fence",
    "epoch",
    "sequence",
    "idempotent",
    "durable",
    "fsync",
    "crash",
    "restart",
    "replay",
    "checkpoint",
    "state",
    "stable",
    "watermark",
    "lag",
    "group",
    "rebalance",
)

console = Console(stderr=True)


def _sentences(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(VOCABULARY, k=rng.randint(3, 12))) for _ in range(count)]


def _produce(bootstrap: str, topic: str, sentences: list[str]) -> None:
    producer = Producer(
        client_config(
            Cluster(bootstrap), ClientErrors(), {"enable.idempotence": True, "linger.ms": 5}
        )
    )
    for i, sentence in enumerate(sentences):
        producer.produce(topic, value=sentence.encode(), key=str(i).encode())
        if i % 1000 == 0:
            producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("sentences were not all acknowledged")


class _Pipeline:
    """The word count driver as a child process, so that it can be SIGKILLed."""

    def __init__(
        self, bootstrap: str, output: str, workdir: Path, exactly_once: bool, per_trigger: int
    ) -> None:
        self.workdir = workdir
        self.checkpoint = workdir / "checkpoint"
        self.args = [
            sys.executable,
            "-m",
            "onceflow.pipelines.wordcount",
            "--bootstrap-server",
            bootstrap,
            "--input",
            "sentences",
            "--output",
            output,
            "--checkpoint",
            str(self.checkpoint),
            "--max-offsets-per-trigger",
            str(per_trigger),
            "--until-caught-up",
        ]
        if not exactly_once:
            self.args.append("--at-least-once")
        self.runs = 0

    def start(self, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.runs += 1
        log = (self.workdir / f"driver-{self.runs}.log").open("wb")
        return subprocess.Popen(
            self.args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )

    def committed_batches(self) -> int:
        commits = self.checkpoint / "commits"
        return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.exists() else 0

    def log_tail(self) -> str:
        text = (self.workdir / f"driver-{self.runs}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-25:])


def _run_with_faults(
    label: str, broker: EmbeddedBroker, pipeline: _Pipeline, crash_after_batch: int, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    console.print(
        f"[bold]{label}[/]: starting the pipeline; it will be SIGKILLed right after "
        f"writing micro-batch {crash_after_batch}"
    )
    first = pipeline.start({CRASH_AFTER_BATCH_ENV: str(crash_after_batch)})
    rc = first.wait(timeout=max(1.0, deadline - time.monotonic()))
    console.print(
        f"  driver killed (exit {rc}) after {pipeline.committed_batches()} committed "
        "micro-batches: the last one wrote its output but is not in the commit log"
    )
    attempts = 0
    while True:
        attempts += 1
        child = pipeline.start()
        console.print(f"  driver restarted from its checkpoint (run {pipeline.runs})")
        if attempts == 1:
            start_batches = pipeline.committed_batches()
            while (
                pipeline.committed_batches() < start_batches + 2
                and child.poll() is None
                and time.monotonic() < deadline
            ):
                time.sleep(0.2)
            broker.kill()
            console.print("  broker SIGKILLed mid-stream ...", end="")
            broker.start()
            console.print(" restarted on the same data directory")
        try:
            rc = child.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            raise RuntimeError(f"{label}: the pipeline did not finish in time") from None
        if rc == 0:
            console.print(f"  caught up after {pipeline.committed_batches()} micro-batches")
            return
        if attempts >= 3:
            raise RuntimeError(f"{label}: the pipeline failed (exit {rc}):\n{pipeline.log_tail()}")
        console.print(f"  driver exited with {rc}; restarting it from its checkpoint")


def demo_command(
    sentences: Annotated[int, typer.Option(help="Sentences to produce.")] = 20_000,
    seed: Annotated[int, typer.Option(help="Seed of the sentence generator.")] = 7,
    per_trigger: Annotated[int, typer.Option(help="maxOffsetsPerTrigger of the source.")] = 2000,
    crash_after_batch: Annotated[
        int, typer.Option(help="Micro-batch after whose output the driver is killed.")
    ] = 3,
    timeout: Annotated[float, typer.Option(help="Seconds each pipeline may take.")] = 600,
    keep: Annotated[
        Path | None, typer.Option(help="Keep the data here instead of a temp dir.")
    ] = None,
) -> None:
    """Exactly-once word count on PySpark through crashes, next to at-least-once."""
    if sentences < 1 or per_trigger < 1 or crash_after_batch < 0:
        raise typer.BadParameter("--sentences and --per-trigger must be positive")
    workdir = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="onceflow-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    broker = EmbeddedBroker(workdir / "broker", settings={"num.partitions": "2"})
    try:
        reports = _demo(workdir, broker, sentences, seed, per_trigger, crash_after_batch, timeout)
    except (RuntimeError, TimeoutError, OSError) as e:
        console.print(f"[red]demo failed:[/] {e}")
        raise typer.Exit(code=1) from None
    finally:
        broker.stop()
    table = Table(title="word count through a driver SIGKILL and a broker SIGKILL")
    for column in ("sink", "expected", "counted", "duplicates", "missing", "exact"):
        table.add_column(column, justify="right" if column != "sink" else "left")
    for label, report in reports.items():
        table.add_row(
            label,
            str(report.expected),
            str(report.counted),
            str(report.duplicates),
            str(report.missing),
            "yes" if report.exact else "no",
        )
    console.print(table)
    for label, report in reports.items():
        print(report.line(label), flush=True)
    if not reports["exactly-once"].exact:
        raise typer.Exit(code=1)


def _demo(
    workdir: Path,
    broker: EmbeddedBroker,
    count: int,
    seed: int,
    per_trigger: int,
    crash_after_batch: int,
    timeout: float,
) -> dict[str, CountReport]:
    console.print(f"starting an embedded broker in {workdir / 'broker'}")
    broker.start()
    bootstrap = broker.bootstrap
    # Quiet: it stays connected while the broker is killed, and librdkafka would log that.
    admin = AdminClient(client_config(Cluster(bootstrap), ClientErrors()))
    topics = ["sentences", "counts-exactly-once", "counts-at-least-once"]
    for future in admin.create_topics([NewTopic(t, 2, 1) for t in topics]).values():
        future.result(30)
    text = _sentences(count, seed)
    truth: Counter[str] = Counter(w for s in text for w in words_of(s))
    console.print(f"producing {count} sentences ({sum(truth.values())} words)")
    _produce(bootstrap, "sentences", text)
    reports = {}
    for label, exactly_once in (("exactly-once", True), ("at-least-once", False)):
        output = f"counts-{label}"
        pipeline = _Pipeline(bootstrap, output, workdir / label, exactly_once, per_trigger)
        pipeline.workdir.mkdir(parents=True, exist_ok=True)
        _run_with_faults(label, broker, pipeline, crash_after_batch, timeout)
        records = read_topic(bootstrap, output, read_committed=True)
        reports[label] = check_counts(truth, records)
        console.print(f"  {reports[label].line(label)}")
    return reports
