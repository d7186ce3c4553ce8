"""`onceflow bench-spark`'s run: end-to-end records/s of the bundled pipelines, exactly-once
sink against the plain (at-least-once) sink, on one local Spark session and one broker."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.table import Table

from onceflow.bench.errors import BenchError
from onceflow.broker.embedded import EmbeddedBroker

console = Console(stderr=True)
# The sentences' vocabulary: eight words a sentence, in turn.
WORDS = (
    "exactly", "once", "streaming", "kafka", "spark",
    "broker", "producer", "consumer", "commit", "offset",
)  # fmt: skip
PIPELINES = ("copy", "wordcount")
# Sinks in the order they run: plain first, so the exactly-once sink never runs cold.
SINKS = (("plain", False), ("eos", True))
# Rates keyed by (pipeline, sink label).
Rates = dict[tuple[str, str], float]


def produce_records(bootstrap: str, topic: str, count: int, value: bytes | None = None) -> None:
    """`count` records of `value` (or of eight words each), all acknowledged."""
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
    pending = producer.flush(120)
    if pending != 0:
        raise BenchError(f"{pending} records to '{topic}' still pending after 120 s")


def run_spark_bench(records: int, sentences: int, per_trigger: int, cores: int) -> Rates:
    """Each pipeline with each sink, after an untimed warm-up; records/s of each."""
    from onceflow.pipelines import copy_topic, wordcount
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
        produce_records(bootstrap, "in", records, b"x" * 100)
        produce_records(bootstrap, "sentences", sentences)
        produce_records(bootstrap, "warm", 10_000, b"x" * 100)
        spark = local_session(cores=cores, app_name="onceflow-bench-spark")
        spark.sparkContext.setLogLevel("ERROR")
        # Warm-up (not timed): Python workers, JIT and clients start before the first figure.
        for label, exactly_once in SINKS:
            warm = copy_topic.start(
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
        # pipeline: (its module, input topic, output topic's prefix, query prefix, records)
        runs = {
            "copy": (copy_topic, "in", "copy", "bench-copy", records),
            "wordcount": (wordcount, "sentences", "counts", "bench-wc", sentences),
        }
        results: Rates = {}
        for label, exactly_once in SINKS:
            for pipeline in PIPELINES:
                module, input_topic, output, prefix, count = runs[pipeline]
                console.print(f"running {pipeline} with the {label} sink")
                query = module.start(
                    spark,
                    bootstrap=bootstrap,
                    input_topic=input_topic,
                    output_topic=f"{output}-{label}",
                    checkpoint=str(work / f"cp-{pipeline}-{label}"),
                    exactly_once=exactly_once,
                    prefix=f"{prefix}-{label}",
                    max_offsets_per_trigger=per_trigger,
                )
                started = time.monotonic()
                query.processAllAvailable()
                results[(pipeline, label)] = count / (time.monotonic() - started)
                query.stop()
        spark.stop()
    finally:
        broker.stop()
    return results


def spark_table(results: Rates, cores: int) -> Table:
    """Each pipeline's rate with either sink, and exactly-once's over plain's."""
    table = Table(title=f"bundled pipelines on local[{cores}], broker with fsync on")
    for column in ("pipeline", "plain sink rec/s", "exactly-once rec/s", "exactly-once / plain"):
        table.add_column(column, justify="left" if column == "pipeline" else "right")
    for pipeline in PIPELINES:
        plain, eos = results[(pipeline, "plain")], results[(pipeline, "eos")]
        table.add_row(
            pipeline + (" (sentences)" if pipeline == "wordcount" else ""),
            f"{plain:,.0f}",
            f"{eos:,.0f}",
            f"{eos / plain:.2f}x",
        )
    return table
