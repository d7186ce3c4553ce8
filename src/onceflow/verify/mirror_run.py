"""The mirror of a `verify --mirror` run: the mirror pipeline (onceflow.pipelines.mirror) as a
supervised child process from the source broker to the target broker, the wait for it to
catch up at the end, and the target's final read_committed pass (checked by mirror_check).

The driver runs in its own session (process group), so that a SIGKILL takes its JVM and Python
workers too, as a machine losing the driver would; it restarts from its checkpoint, and its
positions live in the target (KIP-656), so a kill repeats and loses nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from onceflow.mirror.replication_policy import ReplicationPolicy
from onceflow.verify.faults import CRASH_LOOP_EXITS, Supervisor
from onceflow.verify.final_reads import final_pass
from onceflow.verify.history import READ_COMMITTED, History
from onceflow.verify.history import TopicPartition as Place
from onceflow.verify.mirror_check import MIRROR_READ
from onceflow.verify.workload import WorkloadSpec

# The last line of a Python traceback: the exception's qualified name and its message.
TRACEBACK_END = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b")
MIRROR = "mirror"  # history process and function of the driver's own exits and restarts
ALIAS = "source"
# Bounded batches, as fast as it can: a micro-batch costs Spark about a second whatever its
# size, so small ones would not keep up with the workload.
MAX_OFFSETS_PER_TRIGGER = 5000
# Spark takes seconds to start a driver: a kill before it has run a batch or two proves little.
MIN_UP_S = 20.0


POLICY = ReplicationPolicy("default", ALIAS)  # the mirror's defaults


def target_topic(topic: str) -> str:
    """The target's name of a source topic (`source.{topic}`)."""
    return POLICY.target_topic(topic)


def target_workload(workload: WorkloadSpec) -> WorkloadSpec:
    """The same workload's topics as the target names them (for the target's final read)."""
    return dataclasses.replace(
        workload,
        topics={target_topic(t): n for t, n in workload.topics.items()},
        copy_output=target_topic(workload.copy_output),
    )


class SupervisedMirror(Supervisor):
    """The mirror driver, restarted whenever it exits on its own (process `mirror`)."""

    def __init__(
        self,
        source: str,
        target: str,
        topics: str,
        work_dir: Path,
        history: History,
        transaction_timeout_ms: int,
    ) -> None:
        self.command = [
            sys.executable,
            *("-m", "onceflow.pipelines.mirror"),
            *("--source-bootstrap-server", source),
            *("--target-bootstrap-server", target),
            *("--topics", topics),
            *("--checkpoint", str(work_dir / "mirror-checkpoint")),
            *("--max-offsets-per-trigger", str(MAX_OFFSETS_PER_TRIGGER)),
            *("--progress-interval", "5"),
            *("--target-property", f"transaction.timeout.ms={transaction_timeout_ms}"),
        ]
        # The driver does not exit on a broker's kill (its query rides it out): exits in a row
        # on its own mean it cannot start, as on a checkpoint Spark refuses.
        super().__init__(MIRROR, history, crash_loop=CRASH_LOOP_EXITS)
        self.log = work_dir / "logs" / "mirror.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0  # time.monotonic() of the last spawn

    def start(self) -> None:
        self._spawn()
        self._thread.start()

    def _spawn(self) -> None:
        self.started = time.monotonic()
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: JVM and workers die with it
                env=os.environ.copy(),
            )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self) -> bool:
        """Up long enough to be mirroring (see MIN_UP_S)."""
        return self.running() and time.monotonic() - self.started >= MIN_UP_S

    def kill(self) -> dict[str, int]:
        with self._lock:
            self._held = True
            pid = self._killpg(signal.SIGKILL)
            return {"pid": pid}

    def restart(self) -> None:
        with self._lock:
            self._spawn()
            self.restarts += 1
            self._held = False

    def _killpg(self, sig: signal.Signals) -> int:
        process = self.process
        if process is None:
            return 0
        with contextlib.suppress(ProcessLookupError):  # gone: its group's last member exited
            os.killpg(process.pid, sig)
        process.wait(60)
        return process.pid

    def _process(self) -> subprocess.Popen[Any] | None:
        return self.process

    def _last_words(self) -> str:
        return last_error(self.log)

    def _revive(self, exited: subprocess.Popen[Any]) -> None:
        self._note("exited", code=exited.returncode, error=self._last_words())
        self._killpg(signal.SIGKILL)  # what the driver left behind (its JVM, say)
        self._spawn()
        self.restarts += 1
        self._note("restarted")

    def stop(self) -> None:
        """Stop supervising, then stop the driver and everything it started."""
        self._stop_watching()
        with self._lock:
            if self.running():
                self._killpg(signal.SIGTERM)


def last_error(log: Path, tail_bytes: int = 65536) -> str:
    """The last error a driver's log holds: the closing line of its last Python traceback
    (`module.SomeError: message`, with the Java exception py4j puts on the next line), else
    its last line; "" if it wrote nothing."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    ends = [i for i, line in enumerate(lines) if TRACEBACK_END.match(line)]
    if not ends:
        return next((line.strip() for line in reversed(lines) if line.strip()), "")[:500]
    last = lines[ends[-1]]
    java = lines[ends[-1] + 1] if ends[-1] + 1 < len(lines) else ""
    if java.startswith(": "):  # py4j: "An error occurred while calling o76.start." and then
        last += " " + java
    return last.strip()[:500]


def positions(target: str, partitions: list[Place]) -> dict[Place, int]:
    """{source partition: next source offset the mirror will copy}, as the target holds them
    (the mirror's own lookup); partitions without one, or all if the target did not answer,
    are left out (asked again)."""
    # Imported here: the mirror's modules load PySpark, which only --mirror runs need.
    from onceflow.mirror.positions import MirrorPositions, PositionLookupError

    lookup = MirrorPositions({"bootstrap.servers": target}, POLICY, 10.0)
    try:
        return dict(lookup.committed(partitions))
    except (PositionLookupError, KafkaException):
        return {}
    finally:
        lookup.close()


def wait_caught_up(
    target: str,
    ends: dict[Place, int],
    timeout_s: float,
    progress: Callable[[int, int], None],
    given_up: Callable[[], bool] = lambda: False,
) -> bool:
    """Wait until the target's mirror positions reach `ends` (per source partition, one past
    its last committed record); `progress(behind, partitions)` after every look. False at the
    deadline, or at once when `given_up()` says the driver will not come back."""
    wanted = {tp: end for tp, end in ends.items() if end > 0}
    deadline = time.monotonic() + timeout_s
    while not given_up():
        held = positions(target, list(wanted))
        behind = sum(held.get(tp, -1) < end for tp, end in wanted.items())
        progress(behind, len(wanted))
        if not behind:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
    return False


def committed_ends(ops_finals: dict[Place, dict[int, str]]) -> dict[Place, int]:
    """One past the last committed record of each source partition (its final read_committed
    pass): where the mirror's position stands once it has copied all of it."""
    return {tp: max(at) + 1 for tp, at in ops_finals.items() if at}


def read_target(
    target: str, workload: WorkloadSpec, history: History, settle_s: float, tag: str
) -> None:
    """The target's final read_committed pass over every mirrored partition (process
    `mirror-rc`)."""
    final_pass(
        target, target_workload(workload), READ_COMMITTED, history, settle_s, tag, MIRROR_READ
    )
