"""A driver to SIGKILL: copies a topic with the exactly-once and the plain sink at once.

    python -m tests.spark.driver_job BOOTSTRAP SOURCE CHECKPOINTS run|finish

`run` keeps both queries going until the process is killed; `finish` restarts them from their
checkpoints, processes what is available, and exits 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import DataFrame

import onceflow.spark

from .copy_job import copy_stream, start_copy
from .faults import slow_down

EXACTLY_ONCE_OUT = "{source}-eos"
PLAIN_OUT = "{source}-plain"


def main(bootstrap: str, source: str, checkpoints: Path, mode: str) -> int:
    spark = onceflow.spark.local_session(
        cores=2, app_name="driver-job", conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "25"}
    )
    spark.sparkContext.setLogLevel("ERROR")

    def stream() -> DataFrame:  # one per query: test_sink.test_broker_killed_and_restarted_...
        return copy_stream(spark, bootstrap, source, transform=slow_down(10, 0.05), max_offsets=300)

    available_now = mode == "finish"
    queries = [
        start_copy(
            stream(),
            bootstrap,
            EXACTLY_ONCE_OUT.format(source=source),
            checkpoints / "eos",
            exactly_once=True,
            available_now=available_now,
        ),
        start_copy(
            stream(),
            bootstrap,
            PLAIN_OUT.format(source=source),
            checkpoints / "plain",
            exactly_once=False,
            available_now=available_now,
        ),
    ]
    print("queries started", flush=True)
    for query in queries:
        query.awaitTermination()
        if query.exception() is not None:
            print(f"query failed: {query.exception()}", flush=True)
            return 1
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]))
