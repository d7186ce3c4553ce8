"""`format("onceflow-sql")`: a PySpark sink into PostgreSQL or SQLite, exactly once and
micro-batch atomic.

    df.writeStream.format("onceflow-sql").option("url", "postgresql://...")
      .option("table", "word_counts").option("mode", "upsert").option("keys", "word")
      .option("checkpointLocation", cp).start()

Each task stages its rows (`DataSourceStreamWriter.write`, on the executors); the driver's
`commit(messages, batchId)` then moves the staged rows of the attempts that succeeded into the
table, raises the batch mark and records the Kafka positions the batch read up to (from the
checkpoint's offset log, written before the batch ran), all in one database transaction
(onceflow.sql.batch_commit). Register the format with `register(spark)`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from onceflow.spark.options import OptionError, option
from onceflow.sql.batch_commit import STAGE_CHUNK, commit_batch, stage_rows
from onceflow.sql.engine import check_connects, engine_for
from onceflow.sql.positions import Positions
from onceflow.sql.tables import SinkTables

log = logging.getLogger(__name__)

SQL_FORMAT = "onceflow-sql"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
# Test and demo hook: SIGKILL the driver (its whole process group: the Python driver, the JVM,
# the workers) right after the database committed this batch (`3`), or this table's batch
# (`word_counts:3`), and before Spark's commit log records it.
CRASH_AFTER_COMMIT_ENV = "ONCEFLOW_SQL_CRASH_AFTER_COMMIT"
# Test hook: a directory where a file `fail-task-TABLE` makes one task writing TABLE fail
# right after its rows are staged (committed in staging) and before it reports them.
FAULT_DIR_ENV = "ONCEFLOW_SQL_FAULT_DIR"


class InjectedTaskFault(RuntimeError):
    """Raised on purpose by one task (FAULT_DIR_ENV)."""


def _fail_once_after_staging(table: str) -> None:
    directory = os.environ.get(FAULT_DIR_ENV)
    if not directory:
        return
    trigger = Path(directory) / f"fail-task-{table}"
    try:
        trigger.rename(trigger.with_suffix(".fired"))  # one task wins the rename
    except FileNotFoundError:
        return
    raise InjectedTaskFault(f"task writing {table} fails once after staging its rows")


@dataclass(frozen=True)
class SqlSinkOptions:
    url: str
    table: str
    mode: str  # append | upsert
    keys: tuple[str, ...]
    accumulate: tuple[str, ...]
    pipeline: str
    checkpoint: str | None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SqlSinkOptions:
        url = option(options, "url")
        table = option(options, "table")
        if not url or not table:
            raise OptionError("options 'url' and 'table' are required")
        mode = (option(options, "mode") or "append").strip().lower()
        if mode not in ("append", "upsert"):
            raise OptionError(f"option 'mode' must be append or upsert, got {mode!r}")
        keys = _names(option(options, "keys"))
        accumulate = _names(option(options, "accumulate"))
        if mode == "upsert" and not keys:
            raise OptionError("mode upsert needs option 'keys' (the primary key columns)")
        if mode == "append" and accumulate:
            raise OptionError("option 'accumulate' is for mode upsert")
        return cls(
            url=url,
            table=table,
            mode=mode,
            keys=keys,
            accumulate=accumulate,
            pipeline=option(options, "pipeline") or table,
            checkpoint=option(options, "checkpointLocation"),
        )


def _names(raw: str | None) -> tuple[str, ...]:
    return tuple(n.strip() for n in (raw or "").split(",") if n.strip())


@dataclass(frozen=True)
class StagedTask(WriterCommitMessage):
    """A task attempt's report: its token (the staging rows to move) and row count."""

    writer: str
    query_id: str
    partition: int
    attempt: int
    rows: int


def sink_tables(options: SqlSinkOptions, schema: StructType) -> SinkTables:
    """The tables for `schema`, created when missing and checked when present (on the driver,
    before any task runs: a wrong URL or table fails the query at once)."""
    tables = SinkTables(
        table=options.table,
        columns=tuple((f.name, f.dataType.typeName()) for f in schema.fields),
        keys=options.keys,
    )
    bad = [c for c in options.accumulate if c not in tables.names or c in options.keys]
    if bad:
        raise OptionError(f"option 'accumulate': {bad} are not non-key columns")
    check_connects(options.url)

    tables.create(engine_for(options.url))
    return tables


def _stage(
    options: SqlSinkOptions,
    tables: SinkTables,
    query_id: str,
    batch_id: int,
    batches: Iterator[pa.RecordBatch],
) -> StagedTask:
    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx else 0
    attempt = ctx.attemptNumber() if ctx else 0
    writer = uuid.uuid4().hex

    def chunks() -> Iterator[list[dict]]:
        for batch in batches:
            rows = batch.to_pylist()
            for start in range(0, len(rows), STAGE_CHUNK):
                yield rows[start : start + STAGE_CHUNK]

    rows = stage_rows(options.url, tables, query_id, batch_id, partition, writer, chunks())
    _fail_once_after_staging(options.table)
    return StagedTask(writer, query_id, partition, attempt, rows)


def _writers(messages: list[WriterCommitMessage | None]) -> list[StagedTask]:
    return [m for m in messages if isinstance(m, StagedTask)]


def _local_path(location: str) -> Path | None:
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else location)
    return None


def checkpoint_query_id(checkpoint: str | None) -> str | None:
    """The streaming query's id, from its checkpoint's `metadata` file."""
    root = _local_path(checkpoint) if checkpoint else None
    if root is None or not (root / "metadata").exists():
        return None
    return json.loads((root / "metadata").read_text().splitlines()[0])["id"]


def batch_end_offsets(checkpoint: str | None, batch_id: int) -> Positions:
    """The Kafka offsets batch `batch_id` reads up to, from the checkpoint's offset log (Spark
    writes it before the batch runs): the next offset per topic partition."""
    root = _local_path(checkpoint) if checkpoint else None
    if root is None:
        return {}
    path = root / "offsets" / str(batch_id)
    if not path.exists():
        return {}
    positions: Positions = {}
    for line in path.read_text().splitlines()[2:]:
        try:
            parsed = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(parsed, dict):
            continue
        for topic, parts in parsed.items():
            if not isinstance(parts, dict):
                continue
            for partition, offset in parts.items():
                if isinstance(offset, int) and offset >= 0:
                    positions[(str(topic), int(partition))] = offset
    return positions


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def crash_point(table: str, batch_id: int) -> bool:
    """Whether CRASH_AFTER_COMMIT_ENV names this batch (of any table, or of this one)."""
    name, _, batch = os.environ.get(CRASH_AFTER_COMMIT_ENV, "").rpartition(":")
    return batch == str(batch_id) and name in ("", table)


def kill_driver() -> None:
    """SIGKILL the driver: the JVM's process group (the JVM and the Python driver that launched
    it) and this worker's own (PySpark's daemon puts its workers in a group of their own)."""
    pid = os.getpid()
    while pid > 1:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"org.apache.spark.deploy.SparkSubmit" in cmdline:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
            break
        pid = _parent(pid)
    os.killpg(os.getpgrp(), signal.SIGKILL)


class SqlStreamWriter(DataSourceStreamArrowWriter):
    """Streaming append (`mode=append`; with `keys`, the table's primary key, so that the
    database itself would refuse a row twice) or upsert on keys (`mode=upsert`, Spark's update
    output mode); `accumulate` columns are added to the row already there."""

    def __init__(self, options: SqlSinkOptions, schema: StructType) -> None:
        self.options = options
        self.tables = sink_tables(options, schema)
        if options.checkpoint is None:
            log.warning("onceflow-sql: no checkpointLocation option: positions not recorded")
        elif _local_path(options.checkpoint) is None:
            # The offset log is read from the checkpoint directly (not yet through HDFS/S3)
            log.warning(
                "onceflow-sql: checkpoint %s is not a local path: positions not recorded",
                options.checkpoint,
            )

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedTask:
        ctx = TaskContext.get()
        batch_id = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx else None
        query_id = ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx else None
        if batch_id is None or not query_id:
            raise RuntimeError("onceflow-sql: no batch or query id in the task context")
        return _stage(self.options, self.tables, query_id, int(batch_id), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        staged = _writers(messages)
        query_id = checkpoint_query_id(self.options.checkpoint) or (
            staged[0].query_id if staged else None
        )
        if query_id is None:
            raise RuntimeError(f"onceflow-sql: batch {batchId}: no query id to mark it with")
        moved = commit_batch(
            self.options.url,
            self.tables,
            pipeline=self.options.pipeline,
            query_id=query_id,
            batch_id=batchId,
            writers=[m.writer for m in staged],
            positions=batch_end_offsets(self.options.checkpoint, batchId),
            accumulate=self.options.accumulate,
            upsert=self.options.mode == "upsert",
        )
        if moved is None:
            log.info("onceflow-sql: batch %d was already committed: nothing changed", batchId)
        if crash_point(self.options.table, batchId):
            kill_driver()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("onceflow-sql: batch %d aborted; its staged rows are never moved", batchId)


class SqlBatchWriter(DataSourceArrowWriter):
    """`df.write.format("onceflow-sql")`: the whole write visible at once, or nothing."""

    def __init__(self, options: SqlSinkOptions, schema: StructType) -> None:
        self.options = options
        self.tables = sink_tables(options, schema)
        self.write_id = f"write-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedTask:
        return _stage(self.options, self.tables, self.write_id, 0, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_batch(
            self.options.url,
            self.tables,
            pipeline=self.options.pipeline,
            query_id=self.write_id,
            batch_id=0,
            writers=[m.writer for m in _writers(messages)],
            positions={},
            accumulate=self.options.accumulate,
            upsert=self.options.mode == "upsert",
        )


class OnceflowSqlDataSource(DataSource):
    """Registered as `onceflow-sql`: sinks only."""

    @classmethod
    def name(cls) -> str:
        return SQL_FORMAT

    def _options(self, overwrite: bool) -> SqlSinkOptions:
        if overwrite:
            raise OptionError("onceflow-sql does not overwrite tables: use append or upsert")
        return SqlSinkOptions.parse(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return SqlBatchWriter(self._options(overwrite), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return SqlStreamWriter(self._options(overwrite), schema)


def register(spark: SparkSession) -> SparkSession:
    """Register `onceflow-sql` with a session (SQLAlchemy and psycopg: the spark extra)."""
    spark.dataSource.register(OnceflowSqlDataSource)
    return spark
