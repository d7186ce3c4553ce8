"""A streaming query's checkpoint as the pipelines start it.

Spark writes each offset-log entry to a hidden temporary file (`offsets/.0.<uuid>.tmp`) and
renames it. A driver killed between the two leaves the temporary file; when it was batch 0's,
the restarted query counts as new, and Spark 4 refuses a new query whose `offsets` directory
is not empty (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY), on every restart after."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

_LOGS = ("offsets", "commits")


def local_path(checkpoint: str) -> Path | None:
    """The checkpoint's directory when it is on the local file system, else None."""
    parsed = urlparse(checkpoint)
    if parsed.scheme not in ("", "file"):
        return None
    return Path(parsed.path if parsed.scheme else checkpoint)


def _has_batch(path: Path) -> bool:
    offsets = path / "offsets"
    return offsets.is_dir() and any(p.name.isdigit() for p in offsets.iterdir())


def has_offsets(checkpoint: str) -> bool:
    """Whether Spark will resume this checkpoint (and so ignore startingOffsets)."""
    path = local_path(checkpoint)
    return path is None or _has_batch(path)  # a remote one is not ours to look into


def clear_unfinished_first_batch(checkpoint: str) -> list[Path]:
    """Remove the temporary files a killed driver left in a checkpoint that holds no batch yet,
    so that the query can start again; returns what it removed. A checkpoint with a batch is
    left as it is: Spark resumes it and ignores its temporary files."""
    path = local_path(checkpoint)
    if path is None or _has_batch(path):
        return []
    removed = []
    for log in _LOGS:
        directory = path / log
        if not directory.is_dir():
            continue
        for entry in directory.iterdir():
            if entry.name.startswith(".") and ".tmp" in entry.name and entry.is_file():
                entry.unlink()
                removed.append(entry)
    return removed
