"""A group member in a child process, so that a test can kill it -9 (no LeaveGroup, its
heartbeats just stop) while its own consumers stay in the group."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def assigned_child(
    script: str, bootstrap: str, group: str, topic: str
) -> Iterator[subprocess.Popen[str]]:
    """Run `script` (a consumer of `topic` in `group` that prints "assigned" once it holds
    partitions) with those three arguments; yield it once assigned, kill it at the end."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, bootstrap, group, topic],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "assigned"
        yield child
    finally:
        child.kill()
        child.wait()
