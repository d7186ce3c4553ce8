"""JSON lines (one JSON value a line, blank lines allowed), read with line numbers, as the
file-of-transactions pipeline and `onceflow verify`'s histories both read them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any


class JsonLineError(ValueError):
    """A line that is not JSON; `line` counts from 1, `error` is the decoder's."""

    def __init__(self, line: int, error: json.JSONDecodeError) -> None:
        super().__init__(f"line {line}: {error}")
        self.line = line
        self.error = error


def json_lines(lines: Iterable[str]) -> Iterator[tuple[int, Any]]:
    """(line number, value) of every line that is not blank; JsonLineError at the first
    line that is not JSON."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise JsonLineError(number, e) from None
        yield number, value
