"""Progress of a benchmark on stderr: one line per workload, reset at each round."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from onceflow.tools.output import stderr_console

Key = TypeVar("Key", bound=Hashable)


def bench_progress() -> Progress:
    """Progress bars on stderr (records done of the total, elapsed time), off stdout's tables."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr_console(),
    )


def round_task(
    progress: Progress,
    tasks: dict[Key, TaskID],
    key: Key,
    description: str,
    total: int,
) -> TaskID:
    """The progress line of `key`: added the first time, reset (to zero of `total`) after."""
    if key in tasks:
        progress.reset(tasks[key], total=total, description=description)
    else:
        tasks[key] = progress.add_task(description, total=total)
    return tasks[key]
