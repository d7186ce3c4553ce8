"""The mirror's throughput, source to target: exactly-once against the plain at-least-once
mirror, in one run.

    python benchmarks/mirror.py [--records N] [--partitions P] [--size BYTES] [--rounds R]

Two embedded brokers (fsync off on both, so the figure is the pipeline's, not the disk's),
N records of BYTES in P partitions of the source; each round mirrors the whole topic once with
each mode (plain first; round 0, a warm-up, is not counted), each to its own target
topic (its own --source-alias), with `--until-caught-up` on one local Spark session; records/s
is N over the time from the query's start to its last micro-batch (Spark's start-up in both).
The median of the rounds and the ratio are printed. A benchmark: it prints figures, never fails.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.bench.spark import produce_records
from onceflow.broker.embedded import EmbeddedBroker
from onceflow.pipelines import mirror
from onceflow.spark import local_session

MODES = (("at-least-once", False), ("exactly-once", True))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with (
            EmbeddedBroker(root / "source", fsync=False) as source,
            EmbeddedBroker(root / "target", fsync=False) as target,
        ):
            admin = AdminClient({"bootstrap.servers": source.bootstrap})
            admin.create_topics([NewTopic("bench", args.partitions, 1)])["bench"].result(30)
            produce_records(source.bootstrap, "bench", args.records, b"x" * args.size)
            spark = local_session(app_name="mirror-bench")
            spark.sparkContext.setLogLevel("ERROR")
            rates: dict[str, list[float]] = {label: [] for label, _ in MODES}
            # round 0 is a warm-up (Python workers, JIT), printed but not counted
            for round_ in range(args.rounds + 1):
                for label, exactly_once in MODES:
                    alias = f"{label.replace('-', '')}{round_}"
                    started = time.perf_counter()
                    query = mirror.start(
                        spark,
                        checkpoint=str(root / f"checkpoint-{alias}"),
                        source=source.bootstrap,
                        target=target.bootstrap,
                        topics="bench",
                        alias=alias,
                        exactly_once=exactly_once,
                    )
                    query.processAllAvailable()
                    elapsed = time.perf_counter() - started
                    query.stop()
                    if round_:
                        rates[label].append(args.records / elapsed)
                    print(f"round {round_} {label}: {args.records / elapsed:,.0f} records/s")
            spark.stop()
    medians = {label: statistics.median(r) for label, r in rates.items()}
    for label, rate in medians.items():
        print(f"{label}: {rate:,.0f} records/s (median of {args.rounds})")
    ratio = medians["exactly-once"] / medians["at-least-once"]
    print(f"exactly-once / at-least-once: {ratio:.2f}")


if __name__ == "__main__":
    main()
