"""The client processes of a verify run: started, paused, crashed and restarted by slot.

Each slot (producer0, copier1, reader-rc0, ...) runs one process at a time; every restart is a
new incarnation and a new history process, as in Jepsen. A thread per process copies its
operations from its stdout pipe into the history; when a process dies, whatever it left open
is completed (see History.crashed) only after everything it wrote has been read.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from onceflow.verify.history import COMMIT, INFO, READ_COMMITTED, WORKER, History
from onceflow.verify.java_worker import JAVA_ROLES, JavaWorker
from onceflow.verify.workload import READER, WorkerSpec, WorkloadSpec

ANY_MOMENT, IN_TXN, COMMITTING = "any", "in-txn", "committing"
MOMENTS = (ANY_MOMENT, IN_TXN, COMMITTING)
RESTART_BACKOFF_S = 1.0


@dataclass
class _Slot:
    role: str
    slot: int
    isolation: str
    name: str
    incarnation: int = 0
    process: subprocess.Popen[bytes] | None = None
    label: str = ""
    pump: threading.Thread | None = None
    expected_exit: bool = True
    paused: bool = False
    started_at: float = 0.0
    exits: list[int] = field(default_factory=list)


class WorkerPool:
    def __init__(
        self,
        history: History,
        workload: WorkloadSpec,
        seed: int,
        log_dir: Path,
        bootstrap_for: Callable[[str], str],
        settings: dict[str, str] | None = None,
        java: JavaWorker | None = None,
    ) -> None:
        """`java`: the Java worker, to run the transactional roles in Kafka's Java client."""
        self.history, self.workload, self.seed = history, workload, seed
        self.java = java
        self.log_dir = log_dir
        self.bootstrap_for = bootstrap_for
        self.settings = dict(settings or {})
        self.slots: dict[str, _Slot] = {}
        self.unexpected_exits = 0
        self.torn_lines = 0
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="verify-workers", daemon=True)

    def add(self, role: str, slot: int, isolation: str = READ_COMMITTED) -> str:
        probe = WorkerSpec(role, slot, 0, "", self.seed, isolation)
        self.slots[probe.name] = _Slot(role, slot, isolation, probe.name)
        return probe.name

    def names(self, roles: tuple[str, ...] | None = None) -> list[str]:
        return [n for n, s in self.slots.items() if roles is None or s.role in roles]

    def readers(self) -> list[str]:
        return self.names((READER,))

    # -- lifecycle ---------------------------------------------------------------------------

    def start_all(self) -> None:
        for name in self.slots:
            self.start(name)
        self._watcher.start()

    def start(self, name: str) -> str:
        """Start the slot's next incarnation; returns its history process."""
        with self._lock:
            slot = self.slots[name]
            slot.incarnation += 1
            spec = WorkerSpec(
                slot.role,
                slot.slot,
                slot.incarnation,
                self.bootstrap_for(name),
                self.seed,
                slot.isolation,
                self.settings,
            )
            argument = json.dumps({"worker": spec.to_json(), "workload": self.workload.to_json()})
            command = [sys.executable, "-m", "onceflow.verify.worker", argument]
            if self.java is not None and slot.role in JAVA_ROLES:
                command = self.java.command(argument)
            with (self.log_dir / f"{name}.log").open("ab") as log:
                process = subprocess.Popen(
                    command,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                )
            slot.process, slot.label = process, spec.process
            slot.started_at = time.monotonic()
            slot.expected_exit, slot.paused = False, False
            assert process.stdout is not None
            slot.pump = threading.Thread(
                target=self._pump, args=(process.stdout, spec.process), daemon=True
            )
            slot.pump.start()
            return spec.process

    def _pump(self, stream: IO[bytes], process: str) -> None:
        for raw in stream:
            if not raw.endswith(b"\n"):
                self.torn_lines += 1  # the process died in the middle of a line
                continue
            try:
                line = json.loads(raw)
                self.history.append(
                    process, line["type"], line["f"], line["value"], at=float(line["at"])
                )
            except (ValueError, KeyError, TypeError) as e:
                bad = {"event": "bad-line", "line": raw[:200].decode(errors="replace")}
                self.history.append(process, INFO, WORKER, {**bad, "error": str(e)})

    def _finish(self, slot: _Slot, reason: str) -> None:
        """After the process exited: read the rest of its pipe, close what it left open."""
        assert slot.process is not None
        slot.process.wait()
        if slot.pump is not None:
            slot.pump.join(30)
        slot.exits.append(slot.process.returncode)
        self.history.crashed(slot.label, reason)

    def _wait_for(self, slot: _Slot, moment: str, timeout: float = 5.0) -> None:
        """Wait (briefly) until the slot's process is at `moment`: "any" (now), "in-txn"
        (inside a transaction) or "committing" (its commit requested, not yet answered)."""
        if moment == ANY_MOMENT:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            phase = self.history.txn_phase(slot.label)
            if (moment == IN_TXN and phase is not None) or (
                moment == COMMITTING and phase == COMMIT
            ):
                return
            time.sleep(0.001)

    def pause(self, name: str, moment: str = ANY_MOMENT) -> str:
        with self._lock:
            slot = self.slots[name]
            self._wait_for(slot, moment)
            if slot.process is not None and slot.process.poll() is None:
                slot.process.send_signal(signal.SIGSTOP)
                slot.paused = True
            return slot.label

    def resume(self, name: str) -> None:
        with self._lock:
            slot = self.slots[name]
            if slot.process is not None and slot.paused:
                if slot.process.poll() is None:
                    slot.process.send_signal(signal.SIGCONT)
                slot.paused = False

    def crash(self, name: str, moment: str = ANY_MOMENT) -> str:
        """SIGKILL the slot's process at `moment` (it stays down until start())."""
        with self._lock:
            slot = self.slots[name]
            self._wait_for(slot, moment)
            slot.expected_exit = True
            if slot.process is not None and slot.process.poll() is None:
                slot.process.kill()
            if slot.process is not None:
                self._finish(slot, "crashed (SIGKILL)")
            slot.paused = False
            return slot.label

    def _watch(self) -> None:
        """Restart a process that exited on its own (gave up, or a client bug)."""
        while not self._stopping.wait(0.2):
            with self._lock:
                for name, slot in self.slots.items():
                    process = slot.process
                    if process is None or slot.expected_exit or process.poll() is None:
                        continue
                    if time.monotonic() - slot.started_at < RESTART_BACKOFF_S:
                        continue  # a process that dies at once is not restarted in a tight loop
                    if self._stopping.is_set():
                        return
                    self.unexpected_exits += 1
                    slot.expected_exit = True
                    code = process.returncode
                    self.history.append(slot.label, INFO, WORKER, {"event": "exited", "code": code})
                    self._finish(slot, f"exited with code {code}")
                    self.start(name)

    def stop(self, timeout: float = 60, roles: tuple[str, ...] | None = None) -> list[str]:
        """SIGTERM everyone (or the given roles; each finishes its operation), SIGKILL who is
        still there at the deadline; returns the slots that had to be killed."""
        if roles is None:
            self._stopping.set()
            if self._watcher.is_alive():
                self._watcher.join(5)
        killed = []
        with self._lock:
            live = [
                s
                for s in self.slots.values()
                if s.process and not s.expected_exit and (roles is None or s.role in roles)
            ]
            for slot in live:
                slot.expected_exit = True
                self.resume(slot.name)
                assert slot.process is not None
                if slot.process.poll() is None:
                    slot.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for slot in live:
                assert slot.process is not None
                try:
                    slot.process.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    killed.append(slot.name)
                    slot.process.kill()
                reason = "killed at the end of the run" if slot.name in killed else "stopped"
                self._finish(slot, reason)
        return killed
