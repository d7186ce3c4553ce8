"""The bundled pipelines end to end on the shared SparkSession, against a broker."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path

from pyspark.sql import SparkSession

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.pipelines import copy_topic, file_transactions
from onceflow.pipelines.topic_reader import read_topic
from onceflow.pipelines.wordcount_check import check_counts, words_of
from tests.spark.file_inputs import TRANSACTION_IDS, transaction_files
from tests.spark.kafka_io import create_topic, produce
from tests.spark.word_count_runs import run_to_end, sentences, word_count_across_a_broker_kill


def test_file_transactions_writes_each_file_once_and_bad_files_to_dead_letters(
    spark: SparkSession, bootstrap: str, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    locations, out, dlq = f"files-{suffix}", f"tx-{suffix}", f"dlq-{suffix}"
    for topic in (locations, out, dlq):
        create_topic(bootstrap, topic)
    files, bad = transaction_files(tmp_path)
    produce(bootstrap, locations, files)
    run_to_end(
        file_transactions.start(
            spark,
            bootstrap=bootstrap,
            input_topic=locations,
            output_topic=out,
            dead_letters=dlq,
            checkpoint=str(tmp_path / "cp"),
            max_offsets_per_trigger=2,
        )
    )
    ids = sorted(r.key.decode() for r in read_topic(bootstrap, out))
    assert ids == TRANSACTION_IDS
    [letter] = read_topic(bootstrap, dlq)
    assert letter.key == str(bad).encode()
    assert "line 3" in json.loads(letter.value)["error"]


def copy_to_end(
    spark: SparkSession, bootstrap: str, checkpoint: Path, count: int, **options: str
) -> list[str]:
    """Copy `count` values v0.. from a new topic to another to the end; the values copied."""
    suffix = uuid.uuid4().hex[:8]
    source, target = f"in-{suffix}", f"out-{suffix}"
    create_topic(bootstrap, source)
    create_topic(bootstrap, target)
    produce(bootstrap, source, [f"v{i}" for i in range(count)])
    run_to_end(
        copy_topic.start(
            spark,
            bootstrap=bootstrap,
            input_topic=source,
            output_topic=target,
            checkpoint=str(checkpoint),
            **options,
        )
    )
    return sorted(r.value.decode() for r in read_topic(bootstrap, target))


def test_copy_through_a_transform(spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    values = copy_to_end(
        spark, bootstrap, tmp_path / "cp", 200, transform="tests.spark.test_pipelines:shout_even"
    )
    assert values == sorted(f"V{i}" for i in range(0, 200, 2))


def test_copy_starts_on_a_checkpoint_whose_first_batch_a_kill_cut_short(
    spark: SparkSession, bootstrap: str, tmp_path: Path
) -> None:
    """What a driver SIGKILLed while writing its first offset-log entry leaves: the query's
    metadata and a hidden temporary file, no batch. Spark 4 refused it on every restart
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY); the pipeline clears the debris first."""
    checkpoint = tmp_path / "cp"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
    (checkpoint / "offsets" / f".0.{uuid.uuid4()}.tmp").write_text("v1\n")
    assert copy_to_end(spark, bootstrap, checkpoint, 50) == sorted(f"v{i}" for i in range(50))


def shout_even(key: bytes | None, value: bytes | None) -> tuple[bytes | None, bytes] | None:
    """The transform of test_copy_through_a_transform: upper-case even values, drop odd."""
    assert value is not None
    return None if int(value[1:]) % 2 else (key, value.upper())


def test_word_count_survives_a_broker_restart_between_runs(
    spark: SparkSession, make_broker: object, tmp_path: Path
) -> None:
    broker: EmbeddedBroker = make_broker()  # type: ignore[operator]
    bootstrap = broker.bootstrap
    create_topic(bootstrap, "sentences")
    create_topic(bootstrap, "counts")
    written = sentences(300)
    word_count_across_a_broker_kill(
        spark, broker, written, tmp_path / "cp", prefix="wc-test", max_offsets_per_trigger=50
    )
    truth = Counter(w for s in written for w in words_of(s))
    report = check_counts(truth, read_topic(bootstrap, "counts"))
    assert report.exact, report
