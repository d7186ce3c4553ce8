"""A driver to SIGKILL: copies a topic with the exactly-once and the plain sink at once.

    python -m tests.spark.driver_job BOOTSTRAP SOURCE CHECKPOINTS run|finish

`run` keeps both queries going until the process is killed; `finish` restarts them from their
checkpoints, processes what is available, and exits 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql.streaming import StreamingQuery

import onceflow.spark

from .copy_job import copy_stream, first_batch_done, start_copy
from .faults import slow_down

EXACTLY_ONCE_OUT = "{source}-eos"
PLAIN_OUT = "{source}-plain"


def main(bootstrap: str, source: str, checkpoints: Path, mode: str) -> int:
    spark = onceflow.spark.local_session(
        cores=2, app_name="driver-job", conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "25"}
    )
    spark.sparkContext.setLogLevel("ERROR")

    def start(out: str, checkpoint: str, exactly_once: bool) -> StreamingQuery:
        df = copy_stream(spark, bootstrap, source, transform=slow_down(10, 0.05), max_offsets=300)
        return start_copy(
            df,
            bootstrap,
            out.format(source=source),
            checkpoints / checkpoint,
            exactly_once=exactly_once,
            available_now=mode == "finish",
        )

    # The second query starts once the first has run a micro-batch (see first_batch_done).
    eos = start(EXACTLY_ONCE_OUT, "eos", exactly_once=True)
    if not first_batch_done(eos):
        print(f"query failed: {eos.exception()}", flush=True)
        return 1
    plain = start(PLAIN_OUT, "plain", exactly_once=False)
    print("queries started", flush=True)
    for query in (eos, plain):
        query.awaitTermination()
        if query.exception() is not None:
            print(f"query failed: {query.exception()}", flush=True)
            return 1
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]))
