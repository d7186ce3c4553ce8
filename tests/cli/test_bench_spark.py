"""`onceflow bench-spark`'s table: each pipeline on each target, with the exactly-once sink
over the plain one and each target over the embedded broker (the runs need Spark and a Kafka
cluster: `onceflow bench-spark --apache-kafka fetched`, figures in benchmarks/README.md)."""

from __future__ import annotations

import io

from rich.console import Console

from onceflow.bench.spark import EMBEDDED, kafka_name, spark_table


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
