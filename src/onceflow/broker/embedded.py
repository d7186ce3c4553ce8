"""Run `onceflow broker` as a child process: for tests, the demo, benchmarks and fault runs.

A child process (not a thread) so that it can be killed with SIGKILL and restarted on the same
data directory, exactly as an operator's broker would be.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from contextlib import nullcontext
from pathlib import Path
from typing import TextIO

_READY = re.compile(r"onceflow broker ready on (\S+):(\d+)")
_LISTENERS = re.compile(r"\(listeners: ([^;)]+)")
_METRICS = re.compile(r"onceflow metrics on http://(\S+):(\d+)/metrics")


class BrokerStartError(RuntimeError):
    """The broker process exited or did not report ready in time."""


class EmbeddedBroker:
    def __init__(
        self,
        data_dir: Path,
        *,
        port: int = 0,
        fsync: bool = True,
        settings: dict[str, str] | None = None,
        log_level: str = "WARNING",
        env: dict[str, str] | None = None,
        open_files_limit: int | None = None,
        listeners: str | None = None,
        log_file: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port
        self.fsync = fsync
        self.settings = dict(settings or {})
        self.log_level = log_level
        self.env = dict(env or {})  # e.g. ONCEFLOW_CRASH_AT (see onceflow.fault_points)
        # RLIMIT_NOFILE (soft and hard) of the child, e.g. 1024 to test descriptor bounds.
        self.open_files_limit = open_files_limit
        # Kafka's `listeners` (NAME://HOST:PORT,...) instead of one PLAINTEXT --listen; ports
        # 0 become the bound ones after the first start, kept across restarts.
        self.listeners = listeners
        self.listener_ports: dict[str, int] = {}
        self.process: subprocess.Popen[str] | None = None
        # The last lines the broker wrote, appended by the reader thread (`_pump`); read them
        # through `output`, a copy, never by iterating this deque while the thread appends.
        self._output: deque[str] = deque(maxlen=200)
        self._output_lock = threading.Lock()
        # Every line also appended to this file, across restarts (verify keeps it for the
        # post-mortem).
        self.log_file = log_file
        self.metrics_port: int | None = None  # with metrics.listen: the bound port

    @property
    def output(self) -> list[str]:
        """The last 200 lines the broker wrote (stdout and stderr), oldest first: a copy."""
        with self._output_lock:
            return list(self._output)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def bootstrap_for(self, listener: str) -> str:
        """host:port of the named listener (started with `listeners`)."""
        return f"127.0.0.1:{self.listener_ports[listener.upper()]}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 30.0) -> EmbeddedBroker:
        """Start and wait for the ready line; keeps the port across restarts."""
        cmd = [
            sys.executable,
            "-m",
            "onceflow.broker",
            "--data-dir",
            str(self.data_dir),
            *self._listen_args(),
            "--log-level",
            self.log_level,
            "--fsync" if self.fsync else "--no-fsync",
        ]
        for key, value in self.settings.items():
            cmd += ["-o", f"{key}={value}"]
        self.process = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            preexec_fn=self._limit_open_files if self.open_files_limit else None,
        )
        ready = threading.Event()
        threading.Thread(target=self._pump, args=(self.process, ready), daemon=True).start()
        deadline = time.monotonic() + timeout
        while not ready.wait(0.05):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                tail = "\n".join(self.output)
                raise BrokerStartError(f"broker did not start:\n{tail}")
        return self

    def _listen_args(self) -> list[str]:
        if self.listeners is None:
            return ["--listen", f"127.0.0.1:{self.port}"]
        urls = []
        for url in self.listeners.split(","):
            name, _, address = url.strip().partition("://")
            host = address.rpartition(":")[0]
            port = self.listener_ports.get(name.upper(), int(address.rpartition(":")[2]))
            urls.append(f"{name}://{host}:{port}")
        return ["-o", "listeners=" + ",".join(urls)]

    def _limit_open_files(self) -> None:
        # Runs in the child between fork and exec: only async-signal-safe work here.
        limit = self.open_files_limit
        assert limit is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    def open_fds(self) -> int:
        """Descriptors the broker process holds now, from /proc."""
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def _pump(self, process: subprocess.Popen[str], ready: threading.Event) -> None:
        assert process.stdout is not None
        with open(self.log_file, "a", encoding="utf-8") if self.log_file else nullcontext() as copy:
            for line in process.stdout:
                self._read_line(line, ready, copy)

    def _read_line(self, line: str, ready: threading.Event, copy: TextIO | None) -> None:
        text = line.rstrip()
        with self._output_lock:
            self._output.append(text)
        if copy is not None:
            copy.write(text + "\n")
            copy.flush()
        if (metrics := _METRICS.search(line)) is not None:
            self.metrics_port = int(metrics.group(2))
        match = _READY.search(line)
        if match and not ready.is_set():
            self.port = int(match.group(2))
            bound = _LISTENERS.search(line)
            for url in bound.group(1).split(",") if bound else []:
                name, _, address = url.partition("://")
                self.listener_ports[name] = int(address.rpartition(":")[2])
            ready.set()

    def kill(self) -> None:
        """SIGKILL: no shutdown work at all, as a crash or power cut would leave it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait for a clean exit; returns the exit code."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def restart(self, timeout: float = 30.0) -> EmbeddedBroker:
        self.kill()
        return self.start(timeout)

    def rss_bytes(self) -> int:
        """Resident memory of the broker process, from /proc."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
