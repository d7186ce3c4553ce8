"""`onceflow bench-spark`'s run: end-to-end records/s of the bundled pipelines, exactly-once
sink against the plain (at-least-once) sink, on one local Spark session, against the embedded
broker and (--apache-kafka) an Apache Kafka cluster with the exactly-once production settings
(replication 3, min.insync.replicas 2) in the same run."""

from __future__ import annotations

import shutil
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.table import Table

from onceflow.apache_kafka import Distribution, KafkaCluster
from onceflow.bench.errors import BenchError
from onceflow.broker.embedded import EmbeddedBroker

console = Console(stderr=True)
# The sentences' vocabulary: eight words a sentence, in turn.
WORDS = (
    "exactly", "once", "streaming", "kafka", "spark",
    "broker", "producer", "consumer", "commit", "offset",
)  # fmt: skip
PIPELINES = ("copy", "wordcount", "file-transactions", "mirror")
# What each pipeline's rate counts, where not the input records: the table's label.
COUNTED = {
    "wordcount": "wordcount (sentences)",
    "file-transactions": "file-transactions (rows)",
    "mirror": "mirror (from embedded)",
}
# Rows of each file of transactions the file-transactions pipeline reads.
FILE_ROWS = 100
# Sinks in the order they run: plain first, so the exactly-once sink never runs cold.
SINKS = (("plain", False), ("eos", True))
# Rates keyed by (target, pipeline, sink label).
Rates = dict[tuple[str, str, str], float]
EMBEDDED = "onceflow (embedded, fsync)"
TOPICS = ["in", "sentences", "warm", "warm-out", "warm-counts"] + [
    f"{p}-{s}" for p in ("copy", "counts") for s in ("eos", "plain")
]
# The file-transactions pipeline's topics: file locations in, rows and dead letters out.
FILE_TOPICS = ["files", "warm-files", "warm-transactions", "dead-letters"] + [
    f"transactions-{s}" for s in ("eos", "plain")
]


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


def produce_values(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """One record of each of `values`, in order, all acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for value in values:
        producer.produce(topic, value)
        producer.poll(0)
    pending = producer.flush(120)
    if pending != 0:
        raise BenchError(f"{pending} records to '{topic}' still pending after 120 s")


def transaction_files(directory: Path, files: int, rows: int = FILE_ROWS) -> list[str]:
    """`files` CSV files of `rows` transactions each in `directory`: their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(files):
        path = directory / f"transactions-{f}.csv"
        path.write_text("id,amount\n" + "".join(f"t{f}-{r},{r}.25\n" for r in range(rows)))
        paths.append(str(path))
    return paths


def mirror_alias(label: str, number: int | str) -> str:
    """The mirror's source alias for one sink and round: its own target topic (`{alias}.in`)
    and positions group, so that each round copies the whole input again."""
    return f"bench-{label}-{number}"


@dataclass
class SparkTarget:
    """A broker or cluster the pipelines run against, with its topics' replication factor."""

    name: str
    bootstrap: str
    replication_factor: int


def prepare(
    target: SparkTarget, records: int, sentences: int, files: list[str] | None = None
) -> None:
    """The run's topics (4 partitions each) and their input, on one target; with `files`, the
    file-transactions pipeline's too (the files' locations, and 10 files to warm up on)."""
    admin = AdminClient({"bootstrap.servers": target.bootstrap})
    topics = TOPICS + (FILE_TOPICS if files is not None else [])
    new = [NewTopic(t, 4, target.replication_factor) for t in topics]
    for future in admin.create_topics(new, operation_timeout=60).values():
        future.result(120)
    console.print(f"{target.name}: producing {records} records and {sentences} sentences")
    produce_records(target.bootstrap, "in", records, b"x" * 100)
    produce_records(target.bootstrap, "sentences", sentences)
    produce_records(target.bootstrap, "warm", 10_000, b"x" * 100)
    if files is not None:
        produce_values(target.bootstrap, "files", [f.encode() for f in files])
        produce_values(target.bootstrap, "warm-files", [f.encode() for f in files[:10]])


def run_spark_bench(
    records: int,
    sentences: int,
    per_trigger: int,
    cores: int,
    kafka: Distribution | None = None,
    nodes: int = 3,
    rounds_wanted: int = 1,
    files: int = 2_000,
) -> Rates:
    """Each pipeline with each sink, after an untimed warm-up, on the embedded broker and (with
    `kafka`) on an Apache Kafka cluster of `nodes` nodes; records/s of each. The targets take
    turns for each pipeline and sink, so a shared machine's drift touches both alike; with
    `rounds_wanted` above 1 all of it is repeated and each figure is the median round.
    file-transactions reads `files` files of FILE_ROWS rows (its rate counts rows); mirror
    copies the embedded broker's `records` to a second embedded broker and to the cluster (the
    migration path: its rows are "embedded -> embedded" and "embedded -> the cluster")."""
    from onceflow.pipelines import copy_topic, file_transactions, mirror, wordcount
    from onceflow.spark import local_session

    work = Path(tempfile.mkdtemp(prefix="onceflow-bench-spark-"))
    with ExitStack() as stack:
        # Removed last, after the brokers, the cluster and Spark stop: a full run leaves ~1.8 GB.
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        broker = EmbeddedBroker(work / "broker", settings={"num.partitions": "4"}).start()
        stack.callback(broker.stop)
        targets = [SparkTarget(EMBEDDED, broker.bootstrap, 1)]
        # The mirror's target for each target's row: a second embedded broker, or the cluster.
        mirror_to: dict[str, str] = {}
        mirror_broker = EmbeddedBroker(
            work / "mirror-target", settings={"num.partitions": "4"}
        ).start()
        stack.callback(mirror_broker.stop)
        mirror_to[EMBEDDED] = mirror_broker.bootstrap
        if kafka is not None:
            console.print(f"starting Apache Kafka {kafka.version}, {nodes} nodes")
            cluster = KafkaCluster(
                work / "kafka", nodes, distribution=kafka, jvm_options=(), start_timeout_s=300
            )
            stack.callback(cluster.stop)
            cluster.start()
            targets.append(SparkTarget(kafka_name(nodes), cluster.bootstrap_servers, min(3, nodes)))
            mirror_to[kafka_name(nodes)] = cluster.bootstrap_servers
        paths = transaction_files(work / "files", files)
        for target in targets:
            prepare(target, records, sentences, paths)
        spark = local_session(cores=cores, app_name="onceflow-bench-spark")
        stack.callback(spark.stop)
        spark.sparkContext.setLogLevel("ERROR")
        # Warm-up (not timed): Python workers, JIT and clients start before the first figure;
        # each pipeline once (word count's first run started its own workers on the clock).
        for n, target in enumerate(targets):
            for label, exactly_once in SINKS:
                for module, output in ((copy_topic, "warm-out"), (wordcount, "warm-counts")):
                    warm = module.start(
                        spark,
                        bootstrap=target.bootstrap,
                        input_topic="warm",
                        output_topic=output,
                        checkpoint=str(work / f"warm-{n}-{output}-{label}"),
                        exactly_once=exactly_once,
                        prefix=f"bench-{output}-{label}",
                    )
                    warm.processAllAvailable()
                    warm.stop()
                warm = file_transactions.start(
                    spark,
                    bootstrap=target.bootstrap,
                    input_topic="warm-files",
                    output_topic="warm-transactions",
                    checkpoint=str(work / f"warm-{n}-files-{label}"),
                    exactly_once=exactly_once,
                    prefix=f"bench-files-warm-{label}",
                    dead_letters="dead-letters",
                )
                warm.processAllAvailable()
                warm.stop()
                warm = mirror.start(
                    spark,
                    checkpoint=str(work / f"warm-{n}-mirror-{label}"),
                    source=broker.bootstrap,
                    target=mirror_to[target.name],
                    topics="warm",
                    alias=mirror_alias(label, "warm"),
                    exactly_once=exactly_once,
                    same_cluster=False,
                )
                warm.processAllAvailable()
                warm.stop()
        # pipeline: (its module, input topic, output topic's prefix, query prefix, records)
        runs = {
            "copy": (copy_topic, "in", "copy", "bench-copy", records),
            "wordcount": (wordcount, "sentences", "counts", "bench-wc", sentences),
            "file-transactions": (
                file_transactions,
                "files",
                "transactions",
                "bench-files",
                files * FILE_ROWS,
            ),
            "mirror": (mirror, "in", "", "", records),
        }
        rounds: dict[tuple[str, str, str], list[float]] = {}
        for number in range(1, rounds_wanted + 1):
            for label, exactly_once in SINKS:
                for pipeline in PIPELINES:
                    module, input_topic, output, prefix, count = runs[pipeline]
                    for n, target in enumerate(targets):
                        console.print(
                            f"{target.name}: running {pipeline} with the {label} sink "
                            f"({number}/{rounds_wanted})"
                        )
                        # A fresh checkpoint each round: the whole input again.
                        checkpoint = str(work / f"cp-{n}-{pipeline}-{label}-{number}")
                        if pipeline == "mirror":  # from the embedded broker, to the target
                            query = mirror.start(
                                spark,
                                checkpoint=checkpoint,
                                source=broker.bootstrap,
                                target=mirror_to[target.name],
                                topics=input_topic,
                                alias=mirror_alias(label, number),
                                exactly_once=exactly_once,
                                max_offsets_per_trigger=per_trigger,
                                same_cluster=False,
                            )
                        else:
                            own = (
                                {"dead_letters": "dead-letters"}
                                if module is file_transactions
                                else {}
                            )
                            query = module.start(
                                spark,
                                bootstrap=target.bootstrap,
                                input_topic=input_topic,
                                output_topic=f"{output}-{label}",
                                checkpoint=checkpoint,
                                exactly_once=exactly_once,
                                prefix=f"{prefix}-{label}-{number}",
                                max_offsets_per_trigger=per_trigger,
                                **own,
                            )
                        started = time.monotonic()
                        query.processAllAvailable()
                        rate = count / (time.monotonic() - started)
                        rounds.setdefault((target.name, pipeline, label), []).append(rate)
                        query.stop()
    # The median round (the lower middle one for an even count, as the other benchmarks).
    return {key: sorted(rates)[(len(rates) - 1) // 2] for key, rates in rounds.items()}


def kafka_name(nodes: int) -> str:
    return f"Apache Kafka ({nodes} nodes)"


def spark_table(results: Rates, cores: int) -> Table:
    """Each pipeline's rate with either sink on each target, exactly-once's over plain's, and
    each target's over the embedded broker's."""
    table = Table(title=f"bundled pipelines on local[{cores}]")
    columns = (
        "pipeline", "target", "plain sink rec/s", "exactly-once rec/s", "exactly-once / plain",
        "plain vs embedded", "exactly-once vs embedded",
    )  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column in ("pipeline", "target") else "right")
    targets = list(dict.fromkeys(name for name, _, _ in results))
    for pipeline in PIPELINES:
        if (EMBEDDED, pipeline, "plain") not in results:  # a run without it
            continue
        for target in targets:
            plain, eos = results[(target, pipeline, "plain")], results[(target, pipeline, "eos")]
            base_plain = results[(EMBEDDED, pipeline, "plain")]
            base_eos = results[(EMBEDDED, pipeline, "eos")]
            table.add_row(
                COUNTED.get(pipeline, pipeline),
                target,
                f"{plain:,.0f}",
                f"{eos:,.0f}",
                f"{eos / plain:.2f}x",
                f"{plain / base_plain:.2f}x",
                f"{eos / base_eos:.2f}x",
            )
    return table
