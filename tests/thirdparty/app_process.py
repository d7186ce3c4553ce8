"""A third-party application run as a child process with the third-party venv's interpreter.

quixstreams pins confluent-kafka < 2.13 while onceflow needs >= 2.16, so the frameworks cannot
share onceflow's environment: they live, unchanged and with their own pinned dependencies, in
`.venv-thirdparty` (see requirements.txt), and only talk to the broker over the wire.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
APPS = Path(__file__).resolve().parent / "apps"
REQUIREMENTS = Path(__file__).resolve().parent / "requirements.txt"
INSTALL_HINT = (
    "python -m venv .venv-thirdparty && "
    ".venv-thirdparty/bin/pip install -r tests/thirdparty/requirements.txt"
)


def thirdparty_python(module: str) -> str:
    """The interpreter that has `module`: `ONCEFLOW_THIRDPARTY_PYTHON`, or `.venv-thirdparty`,
    made on first use from requirements.txt (so the README's test command needs nothing more).
    Fails (never skips) when the frameworks cannot be had."""
    python = os.environ.get("ONCEFLOW_THIRDPARTY_PYTHON")
    if python is None:
        python = str(_ensure_venv(REPO / ".venv-thirdparty"))
    if not Path(python).exists():
        pytest.fail(f"no third-party interpreter at {python}; install it with: {INSTALL_HINT}")
    probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.fail(f"{python} cannot import {module}: {probe.stderr[-500:]}\n{INSTALL_HINT}")
    return python


def _ensure_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    done = venv / ".installed"
    with open(REPO / ".venv-thirdparty.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer at a time
        if done.exists():
            return python
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            [str(python), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)],
        ]
        for step in steps:
            made = subprocess.run(step, capture_output=True, text=True)
            if made.returncode != 0:
                pytest.fail(f"could not make {venv}: {made.stderr[-2000:]}\n{INSTALL_HINT}")
        done.touch()
    return python


class AppProcess:
    """One run of an application script; its output goes to a log file kept for failures."""

    def __init__(self, python: str, script: str, args: Sequence[str], log: Path) -> None:
        self.log = log
        # A clean environment: the app must not see onceflow's PYTHONPATH or venv.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1"}
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [python, str(APPS / script), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=log.parent,
            )

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown work, no commit, no abort, as a crash would leave it."""
        if self.alive():
            self.process.kill()
        self.process.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM and wait: the framework's own graceful shutdown."""
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise AssertionError(f"no exit {timeout} s after SIGTERM:\n{self.tail()}") from None

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]
