"""The `onceflow` tools' output: results on stdout (tables that stay one row per line when
piped), progress and notes on stderr."""

from __future__ import annotations

import sys

from rich import box
from rich.console import Console
from rich.table import Table


def stdout_console() -> Console:
    """Console for results; wide when piped, so tables stay one row per line."""
    console = Console(highlight=False, markup=False, soft_wrap=False)
    if not console.is_terminal:
        console = Console(highlight=False, markup=False, width=240)
    return console


def result_table(*columns: str, right_from: int | None = None) -> Table:
    """A plain table for results: a header rule, no borders, cells two or more spaces apart.

    Columns from index `right_from` on are right-aligned (figures line up by their digits).
    """
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for index, column in enumerate(columns):
        right = right_from is not None and index >= right_from
        table.add_column(column, justify="right" if right else "left")
    return table


def stderr_console() -> Console:
    """Console for progress and notes, kept off stdout so results can be piped."""
    return Console(stderr=True, highlight=False, markup=False)


def note(message: str) -> None:
    """A one-line remark on stderr (warnings, dry-run notices)."""
    print(message, file=sys.stderr, flush=True)


def error_line(message: str) -> None:
    print(f"Error: {message}", file=sys.stderr, flush=True)
