"""`onceflow bench-spark`: end-to-end records/s of the bundled pipelines, exactly-once sink
against the plain (at-least-once) sink, in one run on one local Spark session."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.table import Table

from onceflow.broker.embedded import EmbeddedBroker

console = Console(stderr=True)
WORDS = (
    "exactly",
    "once",
    "streaming",
    "kafka",
    "spark",
    "broker",
    "producer",
    "consumer",
    "commit",
    "offset",
)


def _produce(bootstrap: str, topic: str, count: int, value: bytes | None = None) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "acks": "all",
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    for i in range(count):
        payload = (
            value
            if value is not None
            else " ".join(WORDS[(i + j) % len(WORDS)] for j in range(8)).encode()
        )
        while True:
            try:
                producer.produce(topic, payload)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0:
        raise typer.Exit(code=1)


def bench_spark_command(
    records: Annotated[int, typer.Option(help="Records copied per run.")] = 500_000,
    sentences: Annotated[int, typer.Option(help="Sentences counted per run.")] = 100_000,
    per_trigger: Annotated[int, typer.Option(help="maxOffsetsPerTrigger.")] = 100_000,
    cores: Annotated[int, typer.Option(help="local[N] cores.")] = 2,
) -> None:
    """Copy and word count pipelines: exactly-once vs plain sink, records/s and the ratio."""
    if min(records, sentences, per_trigger, cores) < 1:
        raise typer.BadParameter("every option must be positive")
    from onceflow.pipelines import copy, wordcount
    from onceflow.spark import local_session

    work = Path(tempfile.mkdtemp(prefix="onceflow-bench-spark-"))
    broker = EmbeddedBroker(work / "broker", settings={"num.partitions": "4"}).start()
    try:
        bootstrap = broker.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topics = ["in", "sentences", "warm", "warm-out"] + [
            f"{p}-{s}" for p in ("copy", "counts") for s in ("eos", "plain")
        ]
        for future in admin.create_topics([NewTopic(t, 4, 1) for t in topics]).values():
            future.result(30)
        console.print(f"producing {records} records and {sentences} sentences")
        _produce(bootstrap, "in", records, b"x" * 100)
        _produce(bootstrap, "sentences", sentences)
        _produce(bootstrap, "warm", 10_000, b"x" * 100)
        spark = local_session(cores=cores, app_name="onceflow-bench-spark")
        spark.sparkContext.setLogLevel("ERROR")
        # Warm-up (not timed): Python workers, JIT and clients start before the first figure.
        for label, exactly_once in (("plain", False), ("eos", True)):
            warm = copy.start(
                spark,
                bootstrap=bootstrap,
                input_topic="warm",
                output_topic="warm-out",
                checkpoint=str(work / f"warm-{label}"),
                exactly_once=exactly_once,
                prefix=f"bench-warm-{label}",
            )
            warm.processAllAvailable()
            warm.stop()
        results: dict[tuple[str, str], float] = {}
        for label, exactly_once in (("plain", False), ("eos", True)):
            for pipeline, count in (("copy", records), ("wordcount", sentences)):
                console.print(f"running {pipeline} with the {label} sink")
                checkpoint = str(work / f"cp-{pipeline}-{label}")
                if pipeline == "copy":
                    query = copy.start(
                        spark,
                        bootstrap=bootstrap,
                        input_topic="in",
                        output_topic=f"copy-{label}",
                        checkpoint=checkpoint,
                        exactly_once=exactly_once,
                        prefix=f"bench-copy-{label}",
                        max_offsets_per_trigger=per_trigger,
                    )
                else:
                    query = wordcount.start(
                        spark,
                        bootstrap=bootstrap,
                        input_topic="sentences",
                        output_topic=f"counts-{label}",
                        checkpoint=checkpoint,
                        exactly_once=exactly_once,
                        prefix=f"bench-wc-{label}",
                        max_offsets_per_trigger=per_trigger,
                    )
                started = time.monotonic()
                query.processAllAvailable()
                results[(pipeline, label)] = count / (time.monotonic() - started)
                query.stop()
        spark.stop()
    finally:
        broker.stop()
    table = Table(title=f"bundled pipelines on local[{cores}], broker with fsync on")
    for column in ("pipeline", "plain sink rec/s", "exactly-once rec/s", "exactly-once / plain"):
        table.add_column(column, justify="left" if column == "pipeline" else "right")
    for pipeline in ("copy", "wordcount"):
        plain, eos = results[(pipeline, "plain")], results[(pipeline, "eos")]
        table.add_row(
            pipeline + (" (sentences)" if pipeline == "wordcount" else ""),
            f"{plain:,.0f}",
            f"{eos:,.0f}",
            f"{eos / plain:.2f}x",
        )
    Console().print(table)
