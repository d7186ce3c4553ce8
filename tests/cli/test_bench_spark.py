"""`onceflow bench-spark`'s table: each pipeline on each target, with the exactly-once sink
over the plain one and each target over the embedded broker (the runs need Spark and a Kafka
cluster: `onceflow bench-spark --apache-kafka fetched`, figures in benchmarks/README.md)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from onceflow.bench.spark import (
    EMBEDDED,
    PIPELINES,
    kafka_name,
    mirror_alias,
    spark_table,
    transaction_files,
)


def test_the_table_has_each_pipeline_on_each_target_with_its_ratios() -> None:
    kafka = kafka_name(3)
    rates = {
        (EMBEDDED, "copy", "plain"): 100_000.0,
        (EMBEDDED, "copy", "eos"): 80_000.0,
        (EMBEDDED, "wordcount", "plain"): 20_000.0,
        (EMBEDDED, "wordcount", "eos"): 10_000.0,
        (kafka, "copy", "plain"): 50_000.0,
        (kafka, "copy", "eos"): 60_000.0,
        (kafka, "wordcount", "plain"): 30_000.0,
        (kafka, "wordcount", "eos"): 5_000.0,
    }
    out = io.StringIO()
    Console(file=out, width=200).print(spark_table(rates, 2))
    rows = [
        [cell.strip() for cell in line.strip("│┃ ").split("│")]
        for line in out.getvalue().splitlines()
        if line.startswith("│")
    ]
    assert rows == [
        ["copy", EMBEDDED, "100,000", "80,000", "0.80x", "1.00x", "1.00x"],
        ["copy", kafka, "50,000", "60,000", "1.20x", "0.50x", "0.75x"],
        ["wordcount (sentences)", EMBEDDED, "20,000", "10,000", "0.50x", "1.00x", "1.00x"],
        ["wordcount (sentences)", kafka, "30,000", "5,000", "0.17x", "1.50x", "0.50x"],
    ]


def table_rows(rates: dict[tuple[str, str, str], float]) -> list[list[str]]:
    out = io.StringIO()
    Console(file=out, width=250).print(spark_table(rates, 2))
    return [
        [cell.strip() for cell in line.strip("│┃ ").split("│")]
        for line in out.getvalue().splitlines()
        if line.startswith("│")
    ]


def test_every_bundled_pipeline_has_its_rows_and_says_what_its_rate_counts() -> None:
    kafka = kafka_name(3)
    rates = {
        (target, pipeline, sink): rate
        for target, scale in ((EMBEDDED, 1.0), (kafka, 0.5))
        for pipeline, base in zip(PIPELINES, (40_000.0, 16_000.0, 30_000.0, 20_000.0), strict=True)
        for sink, rate in (("plain", base * scale), ("eos", base * scale * 0.8))
    }
    rows = table_rows(rates)
    assert PIPELINES == ("copy", "wordcount", "file-transactions", "mirror")
    assert [(row[0], row[1]) for row in rows] == [
        (label, target)
        for label in (
            "copy",
            "wordcount (sentences)",
            "file-transactions (rows)",
            "mirror (from embedded)",
        )
        for target in (EMBEDDED, kafka)
    ]
    assert rows[-1] == [
        "mirror (from embedded)",
        kafka,
        "10,000",
        "8,000",
        "0.80x",
        "0.50x",
        "0.50x",
    ]


def test_the_files_of_transactions_parse_whole_into_their_rows(tmp_path: Path) -> None:
    from onceflow.pipelines.file_transactions import records_of

    paths = transaction_files(tmp_path / "files", 3, rows=7)
    assert len(set(paths)) == 3
    records = [record for path in paths for record in records_of(path, "tx", "dead")]
    # No file goes to the dead letters: the rate counts rows the pipeline really wrote.
    assert [topic for topic, _, _ in records] == ["tx"] * 21
    assert len({key for _, key, _ in records}) == 21


def test_each_mirror_run_copies_to_its_own_topic_and_positions() -> None:
    # The mirror keeps its positions on the target per alias: a reused alias would copy nothing.
    aliases = [mirror_alias(label, n) for label in ("plain", "eos") for n in ("warm", 1, 2, 3)]
    assert len(set(aliases)) == len(aliases)


def test_the_run_removes_its_work_directory_even_when_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full run writes about 1.8 GB of logs and checkpoints: none of it may stay behind."""
    from onceflow.bench import spark

    work = tmp_path / "work"
    monkeypatch.setattr(spark.tempfile, "mkdtemp", lambda prefix: str(work.mkdir() or work))

    class BrokenBroker:
        def __init__(self, directory: Path, settings: dict[str, str]) -> None:
            (directory / "segment.log").parent.mkdir(parents=True)
            (directory / "segment.log").write_bytes(b"x" * 1024)

        def start(self) -> None:
            raise RuntimeError("the broker did not start")

    monkeypatch.setattr(spark, "EmbeddedBroker", BrokenBroker)
    with pytest.raises(RuntimeError, match="did not start"):
        spark.run_spark_bench(records=1, sentences=1, per_trigger=1, cores=1)
    assert not work.exists()
