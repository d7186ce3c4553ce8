"""Why two streaming queries over the `onceflow` format must not start at the same moment.

Spark (4.x) registers a Python data source with one `java.util.HashMap` of environment
variables, and every function it derives from it (each query's stream reader, the read and
write tasks) shares that map. `PythonStreamingSourceRunner.init()`, run by each query's stream
thread as the query starts, puts four keys into it in place. Two queries starting together
on a fresh registration (a new session: a first start, or a driver restarted from its
checkpoints) can put the same new key at once; HashMap then counts one entry more than it
holds, every task of that source serializes the map with that count, and every attempt fails
with java.io.OptionalDataException as the executor reads it (tests/spark/repro/). Hence
copy_job.first_batch_done: the second query starts once the first has run a micro-batch, when
the keys are there already and the puts only replace values.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

import onceflow.spark
from onceflow.spark import FORMAT

from .copy_job import copy_stream, first_batch_done
from .kafka_io import create_topic, produce

INIT_KEYS = {"SPARK_LOCAL_DIRS", "SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE"}
"""Keys the stream reader's runner puts into the registered source's environment."""


def _environment(spark: SparkSession) -> object:  # a py4j proxy of the java.util.Map
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    return manager.lookupDataSource(FORMAT).dataSourceCls().envVars()


def test_a_stream_start_writes_into_the_environment_every_task_shares(
    spark: SparkSession, bootstrap: str, topic_name: str, tmp_path: Path
) -> None:
    """Pins the Spark behaviour the workaround exists for; if it fails, Spark copies the map
    now (as its PythonPlannerRunner does) and first_batch_done's staggered starts can go."""
    create_topic(bootstrap, topic_name, 1)
    produce(bootstrap, topic_name, ["a", "b"])
    onceflow.spark.register(spark)  # a fresh registration, as in a new session
    env = _environment(spark)
    assert env.getClass().getName() == "java.util.HashMap"
    before = set(dict(env))

    query = (
        copy_stream(spark, bootstrap, topic_name)
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert first_batch_done(query), query.exception()
    finally:
        query.stop()

    # `env` is the registered source's own map (which each of its tasks carries), not a copy
    added = set(dict(env)) - before
    assert added >= INIT_KEYS, f"the stream start added {sorted(added)} to the shared map"
