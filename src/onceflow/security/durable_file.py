"""One small file replaced atomically and durably: written to a temporary file, fsynced,
renamed over the old one, and the directory fsynced, so that a kill -9 or a power loss leaves
the old file or the new one, never a mix. For the security stores (users, ACLs), which are
small and read whole at start."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class DurableFileError(OSError):
    """The file could not be written; one line for the operator."""


def write_json_atomically(path: Path, payload: Any, mode: int = 0o600) -> None:
    """Blocking (fsync): a worker thread in the broker."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as e:
        raise DurableFileError(f"cannot write {path}: {e.strerror or e}") from e


def read_json(path: Path) -> Any | None:
    """The file's content, or None if it does not exist. Raises OSError or ValueError."""
    if not path.exists():
        return None
    return json.loads(path.read_text())


def load_json_store(path: Path, decode: Callable[[Any], T], error: type[Exception]) -> T:
    """A store read whole at start: its file's JSON ({} if there is no file) through `decode`,
    or `error` with one line for the operator when the file cannot be read or decoded."""
    try:
        raw = read_json(path) or {}
    except (OSError, ValueError) as e:
        raise error(f"cannot read {path}: {e}") from None
    try:
        return decode(raw)
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # AttributeError: not an object
        raise error(f"{path} is damaged: {e!r}") from None
