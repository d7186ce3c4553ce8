"""Reproduce, without onceflow, the OptionalDataException of streaming queries started together.

    python tests/spark/repro/two_queries.py --runs 20 --queries 2 --source pyds --sink noop

Each run is a fresh driver process (a fresh SparkSession, as after a driver restart) that
starts `--queries` streaming queries at once, then, in a second fresh process, restarts them
together from their checkpoints. Per start it records which queries failed, whether with
java.io.OptionalDataException, and the state of the registered Python data source's
environment map (a java.util.HashMap that every Python data source task serializes):
`size` is HashMap's counter, `entries` what iterating it finds. A counter above the entries
is the poisoned state that fails every later task deserialization of that source.

Sources: `pyds` (a minimal Python data source, Spark 4's pyspark.sql.datasource) or `rate`
(Spark's own). Sinks: `noop` (Spark's) or `pyds` (the same Python data source's stream
writer). `--mitigate` re-registers the Python data source with a ConcurrentHashMap as its
environment before the queries start. Prints one JSON line per start and a summary; runs Spark
at `nice -n 19`, each process bounded by `--timeout`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

FORMAT = "repro"
UDS_CLASS = "org.apache.spark.sql.execution.datasources.v2.python.UserDefinedPythonDataSource"


def _session(cores: int):
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        InputPartition,
        WriterCommitMessage,
    )

    class Reader(DataSourceStreamReader):
        """Ten new rows per micro-batch over two partitions."""

        def __init__(self) -> None:
            self.end = 0

        def initialOffset(self) -> dict:
            return {"offset": 0}

        def latestOffset(self) -> dict:
            self.end += 10
            return {"offset": self.end}

        def partitions(self, start: dict, end: dict) -> list[InputPartition]:
            lo, hi = start["offset"], end["offset"]
            mid = (lo + hi) // 2
            return [InputPartition((lo, mid)), InputPartition((mid, hi))]

        def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
            lo, hi = partition.value
            for i in range(lo, hi):
                yield (i,)

        def commit(self, end: dict) -> None:
            pass

    class Writer(DataSourceStreamWriter):
        def write(self, iterator: Iterator[object]) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: list, batchId: int) -> None:
            pass

        def abort(self, messages: list, batchId: int) -> None:
            pass

    class Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return FORMAT

        def schema(self) -> str:
            return "value long"

        def streamReader(self, schema: object) -> DataSourceStreamReader:
            return Reader()

        def streamWriter(self, schema: object, overwrite: bool) -> DataSourceStreamWriter:
            return Writer()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(f"local[{cores},4]")
        .appName("two-queries-repro")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    _SOURCE.append(Source)
    return spark


def _registered_function(spark):
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    return manager.lookupDataSource(FORMAT).dataSourceCls()


def _concurrent_environment(spark) -> None:
    """Re-register the source with a thread-safe environment map (same function otherwise)."""
    jvm = spark._jvm
    f = _registered_function(spark)
    env = jvm.java.util.concurrent.ConcurrentHashMap(f.envVars())
    g = jvm.org.apache.spark.api.python.SimplePythonFunction(
        f.command(),
        env,
        f.pythonIncludes(),
        f.pythonExec(),
        f.pythonVer(),
        f.broadcastVars(),
        f.accumulator(),
    )
    uds = getattr(jvm, UDS_CLASS)(g)
    spark._jsparkSession.dataSource().registerPython(FORMAT, uds)


def _environment(spark) -> dict:
    env = _registered_function(spark).envVars()
    entries, keys = 0, env.keySet().iterator()  # toArray() would pad to size()
    while keys.hasNext():
        keys.next()
        entries += 1
    return {"map": env.getClass().getSimpleName(), "size": env.size(), "entries": entries}


def _start(spark, source: str, sink: str, checkpoint: Path):
    if source == "rate":
        df = spark.readStream.format("rate").option("rowsPerSecond", "20").load()
        df = df.selectExpr("value")
    else:
        df = spark.readStream.format(FORMAT).load()
    writer = df.writeStream.format("noop" if sink == "noop" else FORMAT)
    return writer.option("checkpointLocation", str(checkpoint)).trigger(processingTime="0 seconds")


def _poison(spark) -> None:
    """Leave the environment map as a lost race does: HashMap's counter one above its entries.

    Two threads putting the same new key at once both see an empty bin, both link a node (one
    survives) and both count it. Spark's launcher opens java.util to reflection (--add-opens).
    """
    env = _registered_function(spark).envVars()
    field = env.getClass().getDeclaredField("size")
    field.setAccessible(True)
    field.setInt(env, field.getInt(env) + 1)


def _trial(spark, args: argparse.Namespace, trial: int) -> dict:
    """Register the source afresh (a fresh map), start the queries together, wait, report."""
    spark.dataSource.register(_SOURCE[0])
    if args.mitigate:
        _concurrent_environment(spark)
    if args.poison:
        _poison(spark)
    writers = [
        _start(spark, args.source, args.sink, Path(args.dir) / f"q{i}") for i in range(args.queries)
    ]
    queries: list = [None] * len(writers)
    gate = threading.Barrier(len(writers))

    def run(i: int) -> None:
        # this thread's JVM twin (py4j pins threads) must see the session's registered sources
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
        gate.wait()  # release every start() at the same moment
        queries[i] = writers[i].start()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(writers))]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = started + args.wait
    pending = list(queries)
    while pending and time.monotonic() < deadline:
        # done: failed, or ran `--batches` micro-batches
        pending = [q for q in pending if q.isActive and len(q.recentProgress) < args.batches]
        time.sleep(0.2)
    errors = []
    for q in queries:
        exc = q.exception() if not q.isActive else None
        errors.append(None if exc is None else str(exc))
    record = {
        "phase": args.phase,
        "trial": trial,
        "failed": [i for i, e in enumerate(errors) if e is not None],
        "optional_data": [i for i, e in enumerate(errors) if e and "OptionalDataException" in e],
        "stuck": [i for i, q in enumerate(queries) if q.isActive and q in pending],
        "seconds": round(time.monotonic() - started, 1),
        "environment": _environment(spark),
    }
    first_error = next((e for e in errors if e), None)
    if first_error:
        lines = first_error.splitlines()
        record["first_error"] = lines[0][:300]
        record["error_lines"] = [
            line.strip()[:200]
            for line in lines
            if "Exception" in line or "readObject" in line or "HashMap" in line
        ][:12]
    for q in queries:
        if q.isActive:
            q.stop()
    return record


_SOURCE: list = []


def child(args: argparse.Namespace) -> int:
    """One driver (fresh session); `--trials` starts, each after a fresh registration."""
    spark = _session(args.cores)
    for trial in range(args.trials):
        print("RESULT " + json.dumps(_trial(spark, args, trial)), flush=True)
    spark.stop()
    return 0


def _run_child(args: argparse.Namespace, phase: str, work: Path, log: Path) -> list[dict]:
    cmd = [
        "nice",
        "-n",
        "19",
        sys.executable,
        __file__,
        "--child",
        "--phase",
        phase,
        "--dir",
        str(work),
        "--queries",
        str(args.queries),
        "--source",
        args.source,
        "--sink",
        args.sink,
        "--cores",
        str(args.cores),
        "--wait",
        str(args.wait),
        "--batches",
        str(args.batches),
        "--trials",
        str(args.trials),
    ]
    cmd += ["--mitigate"] if args.mitigate else []
    cmd += ["--poison"] if args.poison else []
    with log.open("ab") as out:
        try:
            proc = subprocess.run(
                cmd, stdout=subprocess.PIPE, stderr=out, timeout=args.timeout, check=False
            )
        except subprocess.TimeoutExpired as e:
            out = e.stdout or b""
            proc = None
        else:
            out = proc.stdout
    records = [
        json.loads(line[len("RESULT ") :])
        for line in out.decode(errors="replace").splitlines()
        if line.startswith("RESULT ")
    ]
    if proc is None:
        records.append({"phase": phase, "timeout": True})
    elif proc.returncode != 0:
        records.append({"phase": phase, "exit": proc.returncode})
    return records


def parent(args: argparse.Namespace) -> int:
    phases = ["first", "restart"] if args.phase == "both" else [args.phase]
    totals = {
        p: {"starts": 0, "failed_starts": 0, "optional_data": 0, "poisoned": 0} for p in phases
    }
    log = Path(args.log)
    for run in range(args.runs):
        work = Path(tempfile.mkdtemp(prefix="two-queries-"))
        try:
            for phase in phases:
                for record in _run_child(args, phase, work, log):
                    record["run"] = run
                    print(json.dumps(record), flush=True)
                    t = totals[phase]
                    t["starts"] += "environment" in record
                    t["failed_starts"] += bool(record.get("failed"))
                    t["optional_data"] += bool(record.get("optional_data"))
                    env = record.get("environment") or {}
                    t["poisoned"] += env.get("size", 0) > env.get("entries", 0)
                    t["driver_errors"] = t.get("driver_errors", 0) + ("environment" not in record)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(
        "SUMMARY "
        + json.dumps(
            {
                "source": args.source,
                "sink": args.sink,
                "queries": args.queries,
                "cores": args.cores,
                "trials": args.trials,
                "mitigate": args.mitigate,
                "poison": args.poison,
                "totals": totals,
            }
        ),
        flush=True,
    )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--queries", type=int, default=2)
    p.add_argument("--source", choices=["pyds", "rate"], default="pyds")
    p.add_argument("--sink", choices=["noop", "pyds"], default="noop")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--phase", choices=["first", "restart", "both"], default="both")
    p.add_argument("--wait", type=float, default=60, help="seconds to wait for the micro-batches")
    p.add_argument("--batches", type=int, default=1, help="micro-batches each query must run")
    p.add_argument("--timeout", type=float, default=150, help="seconds per driver process")
    p.add_argument("--trials", type=int, default=1, help="starts per driver, each re-registered")
    p.add_argument("--mitigate", action="store_true")
    p.add_argument("--poison", action="store_true", help="start with the map a lost race leaves")
    p.add_argument("--log", default="two_queries.log", help="the drivers' stderr")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
