"""The input files of the file-of-transactions pipeline tests: two good files (CSV, JSON lines)
and one with a bad amount on its line 3, which goes to the dead letters."""

from __future__ import annotations

import json
from pathlib import Path

TRANSACTION_IDS = sorted([f"t{i}" for i in range(50)] + [f"j{i}" for i in range(30)])
"""The ids the good files hold."""


def transaction_files(directory: Path) -> tuple[list[str], Path]:
    """Write the files in `directory`: their locations (a path, a file:// URL, a path), and the
    bad file."""
    good = directory / "good.csv"
    good.write_text("id,amount\n" + "".join(f"t{i},{i}.5\n" for i in range(50)))
    lines = directory / "more.jsonl"
    lines.write_text("".join(json.dumps({"id": f"j{i}", "amount": i}) + "\n" for i in range(30)))
    bad = directory / "bad.csv"
    bad.write_text("id,amount\nx1,1\nx2,not-a-number\n")
    return [str(good), lines.as_uri(), str(bad)], bad
