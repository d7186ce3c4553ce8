"""A supervised process that keeps failing the same way is given up on, with its last error,
instead of restarted until the run's deadline (a mirror driver refused by its checkpoint at
every start once restarted 48 times in a row and ran the test into its timeout)."""

from __future__ import annotations

import sys
from pathlib import Path

from onceflow.verify.history import History
from onceflow.verify.mirror_run import SupervisedMirror, last_error, wait_caught_up
from tests.waiting import wait_for

REFUSED = "raise RuntimeError('the checkpoint is refused')"


def _mirror(tmp_path: Path, code: str, crash_loop: int, up_s: float) -> SupervisedMirror:
    (tmp_path / "logs").mkdir()
    mirror = SupervisedMirror("127.0.0.1:1", "127.0.0.1:1", "t", tmp_path, History(), 10_000)
    mirror.crash_loop, mirror.crash_loop_up_s = crash_loop, up_s
    mirror.command = [sys.executable, "-c", code]
    return mirror


def _events(mirror: SupervisedMirror) -> list[str]:
    return [op.value["event"] for op in mirror.history.ops]


def test_a_driver_failing_at_every_start_is_given_up_with_its_error(tmp_path: Path) -> None:
    mirror = _mirror(tmp_path, f"print('starting'); {REFUSED}", 3, 30.0)
    mirror.start()
    try:
        wait_for(lambda: mirror.failure is not None, 60, "the supervisor to give up")
    finally:
        mirror.stop()
    assert mirror.failure is not None
    assert "exited 3 times in a row, each within 30 s of its start" in mirror.failure
    assert "RuntimeError: the checkpoint is refused" in mirror.failure, mirror.failure
    assert (mirror.exits, mirror.restarts) == (3, 2)
    assert _events(mirror) == ["exited", "restarted", "exited", "restarted", "gave-up"]
    assert not mirror.running()


def test_a_driver_that_stays_up_between_failures_is_restarted(tmp_path: Path) -> None:
    """Every third start stays up past the window: the quick exits never run three in a row,
    so the driver is always restarted (without the reset it would be given up at the 4th)."""
    count = tmp_path / "starts"
    code = (
        "import pathlib, time\n"
        f"p = pathlib.Path({str(count)!r})\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\n"
        "p.write_text(str(n))\n"
        "if n % 3 == 0:\n"
        "    time.sleep(1.5)\n"
        f"{REFUSED}\n"
    )
    mirror = _mirror(tmp_path, code, 3, 1.0)
    mirror.start()
    try:
        wait_for(lambda: mirror.exits >= 7 or mirror.failure, 60, "seven exits")
    finally:
        mirror.stop()
    assert mirror.failure is None, mirror.failure
    assert mirror.exits >= 7


def test_last_error_is_the_end_of_the_last_traceback(tmp_path: Path) -> None:
    log = tmp_path / "mirror.log"
    assert last_error(log) == ""  # never started
    log.write_text(
        "Traceback (most recent call last):\n  File 'x.py', line 1\n"
        "ValueError: the first\n"
        "26/11/28 15:07:40 ERROR MicroBatchExecution: Query terminated with error\n"
        "Traceback (most recent call last):\n  File 'y.py', line 2\n    raise converted\n"
        "pyspark.errors.exceptions.captured.StreamingQueryException: [STREAM_FAILED] refused\n"
        "=== Streaming Query ===\nCurrent State: ACTIVE\n\n"
    )
    assert last_error(log) == (
        "pyspark.errors.exceptions.captured.StreamingQueryException: [STREAM_FAILED] refused"
    )
    log.write_text(
        "py4j.protocol.Py4JJavaError: An error occurred while calling o76.start.\n"
        ": org.apache.hadoop.fs.FileAlreadyExistsException: Destination exists\n"
        "\tat org.apache.hadoop.fs.RawLocalFileSystem.mkdirs(RawLocalFileSystem.java:898)\n"
    )
    assert last_error(log) == (
        "py4j.protocol.Py4JJavaError: An error occurred while calling o76.start. "
        ": org.apache.hadoop.fs.FileAlreadyExistsException: Destination exists"
    )
    log.write_text("no traceback\nthe last line\n\n")
    assert last_error(log) == "the last line"


def test_waiting_for_the_mirror_stops_when_its_driver_is_given_up() -> None:
    looks: list[int] = []
    caught_up = wait_caught_up(
        "127.0.0.1:1", {}, 600.0, lambda behind, _: looks.append(behind), lambda: True
    )
    assert caught_up is False
    assert looks == []  # not one look at the target: nothing will move its positions
