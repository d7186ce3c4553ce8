"""A bundled pipeline's status line while it runs from the command line: records/s in and
processed and the last batch's duration (from Spark's query progress), and the lag (the input
topic's latest offsets, last stable ones under read_committed, minus the last batch's end)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from confluent_kafka import KafkaException

from onceflow.spark.offset_ranges import OffsetSpecError, PartitionOffsets, from_spark_json
from onceflow.spark.topic_offsets import OffsetLookupError, TopicOffsets


def end_offsets(progress: Mapping[str, Any]) -> PartitionOffsets | None:
    """Where the batch of this progress ended in the input topic (None: not known)."""
    sources = progress.get("sources") or []
    if not sources or sources[0].get("endOffset") is None:
        return None
    try:
        return from_spark_json(sources[0]["endOffset"])
    except OffsetSpecError:
        return None


def status_line(progress: Mapping[str, Any] | None, lag: int | str | None) -> str:
    """One line: batch, records/s in and processed, the batch's duration, the lag."""
    lag_text = "" if lag is None else f", lag {lag:,}" if isinstance(lag, int) else f", lag {lag}"
    if not progress:
        return f"waiting for the first batch{lag_text}"
    duration = (progress.get("durationMs") or {}).get("triggerExecution")
    took = "" if duration is None else f", batch {duration:,} ms"
    return (
        f"batch {progress.get('batchId')}: {progress.get('numInputRows', 0):,} records, "
        f"{progress.get('inputRowsPerSecond') or 0:,.0f} records/s in, "
        f"{progress.get('processedRowsPerSecond') or 0:,.0f} processed{took}{lag_text}"
    )


class QueryStatus:
    """The status line of a query reading `offsets`' topics."""

    def __init__(self, offsets: TopicOffsets | None) -> None:
        self.offsets = offsets

    def lag(self, progress: Mapping[str, Any] | None) -> int | str | None:
        if self.offsets is None:
            return None
        done = end_offsets(progress) if progress else {}
        if done is None:
            return None
        try:
            tps = self.offsets.partitions()
            latest = self.offsets.latest(tps)
        except (OffsetLookupError, KafkaException) as e:  # the cluster away: say so, go on
            return f"unknown ({e})"
        return sum(max(end - done.get(tp, 0), 0) for tp, end in latest.items())

    def line(self, recent: Sequence[Mapping[str, Any]]) -> str:
        last = recent[-1] if recent else None
        return status_line(last, self.lag(last))


class StatusPrinter:
    """Prints `line()` every `every_s` seconds on a thread while the context runs, and once
    more at its end."""

    def __init__(self, line: Callable[[], str], every_s: float, out: TextIO | None = None) -> None:
        self.line, self.every_s, self.out = line, every_s, out or sys.stderr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pipeline-status", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.print()

    def print(self) -> None:
        try:
            text = self.line()
        except Exception as e:  # a status line never stops the pipeline
            text = f"status unavailable: {e}"
        print(text, file=self.out, flush=True)

    def __enter__(self) -> StatusPrinter:
        if self.every_s > 0:
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.every_s + 30)
        if self.every_s > 0 and kind is None:
            self.print()  # where it ended (with --until-caught-up: lag 0)
