"""Functions that pipelines under test run inside Spark tasks: slow-downs and injected failures.

Imported by Spark's Python workers (the session puts the repository on their PYTHONPATH).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark import TaskContext

ArrowMap = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


class InjectedFault(RuntimeError):
    """Raised on purpose by a task's first attempt."""


def _slices(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for start in range(0, batch.num_rows, rows):
            yield batch.slice(start, rows)


def fail_first_attempt(after_rows: int, pause_s: float = 0.5) -> ArrowMap:
    """Pass rows through; the first attempt of each task fails after `after_rows` of them.

    The pause before failing lets the sink downstream hand those rows to its producer.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        first_attempt = ctx is not None and ctx.attemptNumber() == 0
        passed = 0
        for piece in _slices(batches, 25):
            yield piece
            passed += piece.num_rows
            if first_attempt and passed >= after_rows:
                time.sleep(pause_s)
                raise InjectedFault(f"task {ctx.partitionId()} attempt 0 fails after {passed} rows")

    return run


def slow_down(rows: int = 25, pause_s: float = 0.05) -> ArrowMap:
    """Pass rows through in small slices with a pause each, so a batch takes a while to write."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for piece in _slices(batches, rows):
            time.sleep(pause_s)
            yield piece

    return run
