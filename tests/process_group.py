"""Killing a child started in its own process group (start_new_session=True), as a test's
cleanup: the Spark driver's JVM and Python workers go with it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def kill_process_group(process: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGKILL every process left in `process`'s group and reap `process`. The leader may
    have exited already (its JVM may not have): a group with nobody left is no error."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout_s)
