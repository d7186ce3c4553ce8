"""The kill-and-restart scenario both frameworks go through (see running_totals for the job).

Run 1 works slowly and is killed with SIGKILL once every key has some committed outputs and
none has all of them; run 2 resumes from what run 1 committed and finishes the input, then is
killed too; run 3 gets one probe event per key, whose output is the state the application ends
with. The caller's `start` decides whether a run keeps the previous run's local state or starts
from an empty state dir (then the framework restores it from the changelog topic).
"""

from __future__ import annotations

from collections.abc import Callable

from tests.confluent import create_topics
from tests.thirdparty.app_process import AppProcess
from tests.thirdparty.running_totals import (
    CommittedOutputs,
    Event,
    committed_outputs,
    differences,
    expected_outputs,
    keyed_events,
    probe_events,
    produce_events,
)

# start(run number, simulated work per event in ms) -> the running application
StartApp = Callable[[int, float], AppProcess]


def kill_and_restart(
    bootstrap: str,
    start: StartApp,
    source: str,
    sink: str,
    *,
    partitions: int,
    events: int,
    keys: int,
    work_ms: float,
    kill_when: Callable[[], bool] = lambda: True,
    probe: bool = True,
    finished: Callable[[], bool] | None = None,
    timeout: float = 60.0,
) -> list[Event]:
    """Runs the three runs; returns every input event, in the order they were produced.
    `kill_when` adds a condition of the caller's to run 1's kill; without `probe`, run 2 is
    stopped (SIGTERM) once it has finished the input, and there is no run 3. Run 2 has finished
    when every input event has a committed output and `finished` (if given) says so too."""
    create_topics(bootstrap, {source: partitions, sink: partitions})
    inputs = keyed_events(events, keys, seed=10)
    probes = probe_events(inputs)
    produce_events(bootstrap, source, inputs)
    progress = CommittedOutputs(bootstrap, sink, partitions)
    app: AppProcess | None = None
    try:
        app = start(1, work_ms)

        def partway() -> bool:
            return progress.partway(inputs, at_least=events // keys // 5)

        progress.wait_for(
            lambda: partway() and kill_when(), app, timeout, "some outputs of every key committed"
        )
        app.kill()
        progress.poll()  # nothing more can commit now; the kill must have been mid-stream
        assert partway(), f"the kill did not land mid-stream: {progress.per_key}"

        app = start(2, 0)

        def done() -> bool:
            return progress.covers(inputs) and (finished is None or finished())

        progress.wait_for(done, app, timeout, "the end of the input")
        if not probe:
            app.stop()
            return inputs
        app.kill()

        produce_events(bootstrap, source, probes)
        app = start(3, 0)
        progress.wait_for(lambda: progress.covers(probes), app, timeout, "the probes' outputs")
        app.stop()
    finally:
        progress.close()
        if app is not None:
            app.kill()  # a failed wait leaves no application running (no-op after a stop)
    return inputs + probes


def assert_exact_outputs(bootstrap: str, sink: str, partitions: int, events: list[Event]) -> None:
    """Every event has exactly one committed output, in per-key order, with the exact value."""
    got = committed_outputs(bootstrap, sink, partitions)
    problems = differences(got, expected_outputs(events))
    assert not problems, "the committed output leaves the model:\n" + "\n".join(problems)
