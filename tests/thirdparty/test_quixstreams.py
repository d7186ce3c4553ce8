"""A quixstreams application with processing_guarantee="exactly-once" and a stateful step
(RocksDB state with a changelog topic) on onceflow, killed with SIGKILL mid-stream and
restarted, with its local state kept or lost (then restored from the changelog topic, also
while the cleaner compacts it): the committed output is exact, event for event, and so is the
state it ends with."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from onceflow.broker.embedded import EmbeddedBroker
from tests.thirdparty.app_process import AppProcess, thirdparty_python
from tests.thirdparty.scenario import assert_exact_outputs, kill_and_restart

BROKER_SETTINGS = {
    # the app's session.timeout.ms is 2 s, below Kafka's default minimum of 6 s
    "group.min.session.timeout.ms": "1000",
    # quixstreams' transactional.id is random per process, so a killed instance's transaction
    # is not fenced by its successor: it stays open (and holds the last stable offset) until
    # its 5 s timeout, then the broker aborts it; look for that often
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
}


# The changelog topic is compacted (quixstreams creates it with cleanup.policy=compact):
# segments rolled by time (by size, a segment would have to hold the largest batch) and an
# eager cleaner, so that the restore reads a changelog the cleaner has rewritten (latest
# record per key, aborted transactions' records removed, markers kept until safe).
EAGER_COMPACTION = {
    "log.roll.ms": "300",
    "log.cleaner.backoff.ms": "100",
    "log.cleaner.min.cleanable.ratio": "0.01",
}


@pytest.mark.parametrize(
    ("local_state", "compaction"),
    [("kept", False), ("lost", False), ("lost", True)],
    ids=["state-kept", "state-lost", "state-lost-compacted"],
)
def test_quixstreams_exactly_once_across_sigkill(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path, local_state: str, compaction: bool
) -> None:
    python = thirdparty_python("quixstreams")
    broker = make_broker(settings={**BROKER_SETTINGS, **(EAGER_COMPACTION if compaction else {})})
    run_id = uuid.uuid4().hex[:8]
    source, sink, group = f"in-{run_id}", f"out-{run_id}", f"counter-{run_id}"

    def start(run: int, work_ms: float) -> AppProcess:
        state = "state" if local_state == "kept" else f"state-{run}"
        args = ["--bootstrap", broker.bootstrap, "--group", group, "--input", source]
        args += ["--output", sink, "--state-dir", str(tmp_path / state)]
        args += ["--work-ms", str(work_ms)]
        return AppProcess(python, "quix_counter.py", args, tmp_path / f"run-{run}.log")

    # 1200 events at 4 ms of work each: about 5 s, so that the kill lands mid-stream
    events = kill_and_restart(
        broker.bootstrap, start, source, sink, partitions=2, events=1200, keys=6, work_ms=4
    )
    assert_exact_outputs(broker.bootstrap, sink, 2, events)
