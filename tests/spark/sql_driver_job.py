"""A driver to SIGKILL: the bundled word count and copy into each database given.

    python -m tests.spark.sql_driver_job BOOTSTRAP CHECKPOINTS TABLE=URL [TABLE=URL...]

Runs each pipeline (its table: word_counts or events) into its database, the queries at once,
to the end of their input and exits 0, unless ONCEFLOW_SQL_CRASH_AFTER_COMMIT kills it right
after a database commit.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pyspark.sql.streaming import StreamingQuery

import onceflow.spark
from onceflow.pipelines import copy_topic, wordcount

PIPELINES = {"word_counts": wordcount, "events": copy_topic}


def checkpoint(checkpoints: Path, index: int, table: str) -> Path:
    return checkpoints / str(index) / table


def first_trigger(query: StreamingQuery, timeout: float = 120) -> None:
    """Wait until `query` has run a trigger, ended, or `timeout` passed (then go on)."""
    deadline = time.monotonic() + timeout
    while query.isActive and query.lastProgress is None and time.monotonic() < deadline:
        time.sleep(0.1)


def main(bootstrap: str, checkpoints: Path, targets: list[str]) -> int:
    spark = onceflow.spark.local_session(cores=2, app_name="sql-driver-job")
    spark.sparkContext.setLogLevel("ERROR")
    queries = []
    for i, (table, url) in enumerate(t.split("=", 1) for t in targets):
        if queries:
            # a fresh session's first streaming Python source starts alone (see
            # copy_job.first_batch_done): concurrent starts race in Spark, and on a loaded
            # machine a second runner can time out connecting back
            first_trigger(queries[0])
        queries.append(
            PIPELINES[table].start(
                spark,
                bootstrap=bootstrap,
                input_topic="sentences",
                output_topic="",
                checkpoint=str(checkpoint(checkpoints, i, table)),
                max_offsets_per_trigger=50,
                sink_url=url,
                table=table,
            )
        )
    for query in queries:
        query.processAllAvailable()
    for query in queries:
        query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3:]))
