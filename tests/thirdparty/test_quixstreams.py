"""A quixstreams application with processing_guarantee="exactly-once" and a stateful step
(RocksDB state with a changelog topic) on onceflow, killed with SIGKILL mid-stream and
restarted, with its local state kept or lost (then restored from the changelog topic): the
committed output is exact, event for event, and so is the state it ends with."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from onceflow.broker.embedded import EmbeddedBroker
from tests.eos.conftest import create_topics
from tests.thirdparty.app_process import AppProcess, thirdparty_python
from tests.thirdparty.running_totals import (
    CommittedOutputs,
    committed_outputs,
    differences,
    expected_outputs,
    keyed_events,
    probe_events,
    produce_events,
)

EVENTS = 1200
KEYS = 6
PARTITIONS = 2
WORK_MS = 4  # per event in the first run: about 5 s of work, so the kill lands mid-stream
BROKER_SETTINGS = {
    # the app's session.timeout.ms is 2 s, below Kafka's default minimum of 6 s
    "group.min.session.timeout.ms": "1000",
    # the killed instance's transaction (5 s timeout) is aborted soon after it expires
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
}


@pytest.mark.parametrize("local_state", ["kept", "lost"])
def test_quixstreams_exactly_once_across_sigkill(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path, local_state: str
) -> None:
    python = thirdparty_python("quixstreams")
    broker = make_broker(settings=BROKER_SETTINGS)
    run_id = uuid.uuid4().hex[:8]
    source, sink, group = f"in-{run_id}", f"out-{run_id}", f"counter-{run_id}"
    create_topics(broker.bootstrap, {source: PARTITIONS, sink: PARTITIONS})
    events = keyed_events(EVENTS, KEYS, seed=10)
    probes = probe_events(events)
    produce_events(broker.bootstrap, source, events)
    progress = CommittedOutputs(broker.bootstrap, sink, PARTITIONS)

    def start(run: int, state: str, work_ms: float = 0) -> AppProcess:
        args = ["--bootstrap", broker.bootstrap, "--group", group, "--input", source]
        args += ["--output", sink, "--state-dir", str(tmp_path / state)]
        args += ["--work-ms", str(work_ms)]
        return AppProcess(python, "quix_counter.py", args, tmp_path / f"run-{run}.log")

    def state_dir(run: int) -> str:
        return "state" if local_state == "kept" else f"state-{run}"

    # Run 1: SIGKILL once every key has some committed outputs (and none has all of them).
    app = start(1, state_dir(1), WORK_MS)
    partway = lambda: progress.partway(events, at_least=EVENTS // KEYS // 5)  # noqa: E731
    progress.wait_for(partway, app, 60, "some outputs of every key committed")
    app.kill()
    progress.poll()  # nothing more can commit now; the kill must have been mid-stream
    assert partway(), f"the kill did not land mid-stream: {progress.per_key}"

    # Run 2 resumes from the committed offsets and state, and finishes the input.
    app = start(2, state_dir(2))
    progress.wait_for(lambda: progress.covers(events), app, 60, "every event's output")
    app.kill()

    # Run 3 (a fresh state dir when local state is lost: restored from the changelog topic)
    # gets one probe per key: its output is the final state the application holds.
    produce_events(broker.bootstrap, source, probes)
    app = start(3, state_dir(3))
    progress.wait_for(lambda: progress.covers(probes), app, 60, "the probes' outputs")
    app.stop()
    progress.close()

    got = committed_outputs(broker.bootstrap, sink, PARTITIONS)
    assert differences(got, expected_outputs(events + probes)) == []
