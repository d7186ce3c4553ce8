"""Running the `onceflow` command in tests, and reading what it printed."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from typer.testing import CliRunner

from onceflow.bench.targets import free_port
from onceflow.cli.main import app


@dataclass
class Outcome:
    """What one command run left behind."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return self.stdout.splitlines()

    def table_rows(self, first_cell: str | None = None) -> list[list[str]]:
        """Data rows of the results tables in stdout (cells are at least two spaces apart).

        Header rows (and the rule under them) and `topics describe`'s "Topic: ..." lines are
        dropped; with first_cell, only rows starting with it are kept.
        """
        rows: list[list[str]] = []
        lines = self.lines
        for i, line in enumerate(lines):
            if not line.strip() or set(line.strip()) <= {"─", " "} or line.startswith("Topic: "):
                continue
            is_header = i + 1 < len(lines) and set(lines[i + 1].strip()) == {"─"}
            if is_header:
                continue
            cells = re.split(r"\s{2,}", line.strip())
            if first_cell is None or cells[0] == first_cell:
                rows.append(cells)
        return rows

    def assert_one_error_line(self) -> str:
        """A failure must be one line on stderr, never a traceback; returns that line."""
        assert "Traceback" not in self.stderr, self.stderr
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, self.stderr
        assert lines[0].startswith("Error: "), self.stderr
        return lines[0]


Run = Callable[..., Outcome]


def produce_one_per_batch(run: Run, bootstrap: str, topic: str, values: Sequence[str]) -> None:
    """`onceflow produce` of these values, one record per batch: Tansu reports a batch's base
    offset + 1 as the high watermark, so offsets read back stay exact on it too."""
    produced = run(
        "produce",
        topic,
        "--producer-property",
        "batch.num.messages=1",
        "-b",
        bootstrap,
        input="".join(f"{value}\n" for value in values),
    )
    assert produced.exit_code == 0, produced.stderr


def invoke(*args: str, input: str | bytes | None = None) -> Outcome:
    """`onceflow ARGS...` in this process, with stdin from `input`."""
    result = CliRunner().invoke(app, list(args), input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Outcome(result.exit_code, result.stdout, result.stderr)


def run_subprocess(args: Sequence[str], timeout: float = 60) -> Outcome:
    """`onceflow ARGS...` through the real entry point, in a child process."""
    done = subprocess.run(
        [sys.executable, "-m", "onceflow.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return Outcome(done.returncode, done.stdout, done.stderr)


def closed_port_address() -> str:
    """An address where nothing listens (its port was free a moment ago)."""
    return f"127.0.0.1:{free_port()}"
