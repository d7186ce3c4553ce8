"""The bundled word count run twice with a broker kill -9 between the runs, as the pipelines
tests and the compacted-topic tests both run it."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.pipelines import wordcount
from tests.spark.kafka_io import produce


def run_to_end(query: object) -> None:
    """Process everything available now, then stop the streaming query."""
    query.processAllAvailable()  # type: ignore[attr-defined]
    query.stop()  # type: ignore[attr-defined]


def sentences(count: int) -> list[str]:
    """`count` sentences over a small vocabulary, "the" in every one."""
    return [f"the quick fox {i % 7} jumps over the dog {i % 3}" for i in range(count)]


def word_count_across_a_broker_kill(
    spark: SparkSession,
    broker: EmbeddedBroker,
    written: list[str],
    checkpoint: Path,
    *,
    prefix: str,
    max_offsets_per_trigger: int,
) -> None:
    """Count the words of `written` from "sentences" into "counts" (both created by the
    caller): half produced and counted, the broker killed -9 and restarted, the other half
    produced and counted by a second run from the same checkpoint."""
    half = len(written) // 2
    produce(broker.bootstrap, "sentences", written[:half])
    options = dict(
        bootstrap=broker.bootstrap,
        input_topic="sentences",
        output_topic="counts",
        checkpoint=str(checkpoint),
        prefix=prefix,
        max_offsets_per_trigger=max_offsets_per_trigger,
    )
    run_to_end(wordcount.start(spark, **options))
    broker.kill()
    broker.start()
    produce(broker.bootstrap, "sentences", written[half:])
    run_to_end(wordcount.start(spark, **options))
