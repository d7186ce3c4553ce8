"""What every bundled pipeline shares: its options (the topics, the checkpoint, the sink),
its source and sink, and the Spark session it runs on (local by default, a cluster with
--master)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from onceflow.client_properties import ClientPropertiesError, load_client_properties
from onceflow.pipelines.checkpoint import clear_unfinished_first_batch
from onceflow.pipelines.progress import QueryStatus, StatusPrinter
from onceflow.spark import local_session, register
from onceflow.spark.options import SourceOptions
from onceflow.spark.topic_offsets import TopicOffsets


def add_common_arguments(
    p: argparse.ArgumentParser, *, input_topic: str | None, output_topic: str | None
) -> None:
    """The options every pipeline has; their destinations are PipelineOptions' fields. The
    topics default to `input_topic` and `output_topic`, and are required where None."""
    p.add_argument(
        "--bootstrap-server",
        dest="bootstrap",
        metavar="HOST:PORT",
        required=True,
        help="Kafka bootstrap servers.",
    )
    p.add_argument("--checkpoint", required=True, help="Spark checkpoint directory.")
    p.add_argument("--prefix", default=None, help="Transactional id prefix (stable per query).")
    p.add_argument(
        "--at-least-once",
        dest="exactly_once",
        action="store_false",
        help="Plain sink, for comparison.",
    )
    p.add_argument("--max-offsets-per-trigger", type=int, default=None)
    p.add_argument(
        "--until-caught-up",
        action="store_true",
        help="Stop once every available record is processed.",
    )
    p.add_argument("--master", default=None, help="Spark master [local[2,4]].")
    p.add_argument(
        "--progress-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="Print a status line (records/s, batch duration, lag) on stderr this often; "
        "0: never [10].",
    )
    p.add_argument(
        "--command-config",
        dest="client",
        type=client_properties_file,
        default={},
        metavar="FILE",
        help="Client settings of the source and the sink (security.protocol, sasl.*, ssl.*): "
        "a Kafka properties file, as the onceflow tools take.",
    )
    for option, dest, default, what in (
        ("--input", "input_topic", input_topic, "The topic it reads"),
        ("--output", "output_topic", output_topic, "The topic it writes"),
    ):
        where = f" [{default}]" if default else ""
        p.add_argument(
            option,
            dest=dest,
            metavar="TOPIC",
            default=default,
            required=not default,
            help=f"{what}{where}.",
        )


def client_properties_file(path: str) -> dict[str, str]:
    """An argparse `type`: the librdkafka settings of a properties file (one-line error)."""
    try:
        return load_client_properties(Path(path))
    except ClientPropertiesError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def session(app_name: str, master: str | None) -> SparkSession:
    """`local[2,4]` unless a master is given or the job runs under spark-submit."""
    if master or os.environ.get("SPARK_HOME") or os.environ.get("SPARK_ENV_LOADED"):
        builder = SparkSession.builder.appName(app_name)
        return register((builder.master(master) if master else builder).getOrCreate())
    return local_session(app_name=app_name)


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineOptions:
    """What every bundled pipeline takes: the topic it reads, the topic it writes, the
    checkpoint, and how its sink writes."""

    bootstrap: str
    input_topic: str
    output_topic: str
    checkpoint: str
    prefix: str | None = None
    exactly_once: bool = True
    max_offsets_per_trigger: int | None = None
    client: dict[str, str] = field(default_factory=dict)  # settings of every client it makes

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PipelineOptions:
        """From the options add_common_arguments declared."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    def kafka_options(self) -> dict[str, str]:
        """The client settings as the source's and sink's `kafka.`-prefixed options."""
        return {f"kafka.{key}": value for key, value in self.client.items()}

    def source_options(self) -> SourceOptions:
        """The source's options as the source parses them (for the status line's lag)."""
        return SourceOptions.parse(
            {
                "kafka.bootstrap.servers": self.bootstrap,
                **self.kafka_options(),
                "subscribe": self.input_topic,
            },
            streaming=True,
        )

    def source(self, spark: SparkSession, starting: str = "earliest") -> DataFrame:
        """The input topic from its earliest offsets (or `starting`: Spark's startingOffsets,
        for a new query only), read_committed."""
        reader = (
            spark.readStream.format("onceflow")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .options(**self.kafka_options())
            .option("subscribe", self.input_topic)
            .option("startingOffsets", starting)
        )
        if self.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(self.max_offsets_per_trigger))
        return reader.load()

    def start_sink(self, df: DataFrame, *, topic_column: bool = False) -> StreamingQuery:
        """Start `df` into the onceflow sink (append mode): to the output topic, or with
        `topic_column` to the topic each row names."""
        writer = (
            df.writeStream.format("onceflow")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .options(**self.kafka_options())
            .option("checkpointLocation", self.checkpoint)
            .option("exactlyOnce", str(self.exactly_once).lower())
        )
        if not topic_column:
            writer = writer.option("topic", self.output_topic)
        if self.prefix:
            writer = writer.option("transactional.id.prefix", self.prefix)
        clear_unfinished_first_batch(self.checkpoint)
        return writer.start()


Build = Callable[..., StreamingQuery]  # (spark, PipelineOptions, **its own keywords)
Start = Callable[..., StreamingQuery]  # (spark, **PipelineOptions' fields and its own)


def pipeline(build: Build) -> Start:
    """A pipeline's `start(spark, **keywords)`: the PipelineOptions fields as keywords (the
    API the tests, the benchmark and users call), the rest passed on to `build` as its own."""
    common = {f.name for f in fields(PipelineOptions)}

    def start(spark: SparkSession, **keywords: Any) -> StreamingQuery:
        options = PipelineOptions(**{k: v for k, v in keywords.items() if k in common})
        return build(spark, options, **{k: v for k, v in keywords.items() if k not in common})

    start.__doc__ = build.__doc__
    return start


def run_until(query: StreamingQuery, until_caught_up: bool) -> None:
    if until_caught_up:
        query.processAllAvailable()
        query.stop()
    else:
        query.awaitTermination()


def run_pipeline(start: Start, app_name: str, args: argparse.Namespace, **own: Any) -> None:
    """A pipeline's main(): `start` it with the options every pipeline has and its `own`
    keywords; then run it (to the end of its input with --until-caught-up, else for good)."""
    options = PipelineOptions.from_args(args)
    query = start(session(app_name, args.master), **asdict(options), **own)
    offsets = TopicOffsets(options.source_options())
    status = QueryStatus(offsets)
    try:
        with StatusPrinter(lambda: status.line(query.recentProgress), args.progress_interval):
            run_until(query, args.until_caught_up)
    finally:
        offsets.close_clients()
