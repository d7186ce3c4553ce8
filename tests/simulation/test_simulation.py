"""Deterministic simulation of the exactly-once cores: thousands of seeds, each a random mix of
clients, lost, duplicated and retried requests, clock jumps, client crashes, zombies and broker
crashes, checked after every step. A failing seed prints the command that replays it exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest

from onceflow.groups.offsets import OffsetStore
from onceflow.log.aborted_index import AbortedTxnIndex
from onceflow.log.producer_state import ProducerStateManager
from onceflow.simulation import SimulationConfig, SimulationFailure, run_seed
from onceflow.simulation.__main__ import main
from onceflow.txn.coordinator import TransactionCoordinator

SEEDS = 5000
CHUNK = 100
# Seeds that once failed; they run whatever SEEDS is.
# 50323: a timed-out EndTxn(commit) copy delivered in the next transaction committed it early
# (a hazard of transaction version 1, not of the cores): timeouts now close the connection.
REGRESSION_SEEDS: list[int] = [50323]


@pytest.fixture(autouse=True)
def _quiet_recovery_warnings() -> Iterator[None]:
    # Torn snapshots and index entries are simulated on purpose; their warnings are expected.
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def _run(seeds: range | list[int], config: SimulationConfig | None = None) -> dict[str, int]:
    totals: dict[str, int] = {}
    failures: list[str] = []
    for seed in seeds:
        try:
            result = run_seed(seed, config)
        except SimulationFailure as failure:
            failures.append(str(failure))
            continue
        for name, count in result.stats.items():
            totals[name] = totals.get(name, 0) + count
    assert not failures, "\n".join(failures)
    return totals


def test_regression_seeds() -> None:
    _run(REGRESSION_SEEDS)


@pytest.mark.parametrize("first", range(0, SEEDS, CHUNK), ids=lambda s: f"seeds{s}-{s + CHUNK - 1}")
def test_seeds(first: int) -> None:
    totals = _run(range(first, first + CHUNK))
    # Each chunk exercises every kind of fault and both transaction outcomes.
    for kind in (
        "crash",
        "lost-request",
        "lost-response",
        "duplicated-request",
        "clock-jump",
        "client-crash",
        "client-pause",
        "timeout-abort",
        "txn-committed",
        "txn-aborted",
        "txn-committed-v2",
    ):
        assert totals.get(kind, 0) > 0, f"no {kind} in seeds {first}..{first + CHUNK - 1}"


def test_without_faults_every_transaction_ends_as_its_client_decided() -> None:
    config = SimulationConfig(faults=False)
    totals = _run(range(50), config)
    assert totals.get("txn-committed", 0) > 50
    assert totals.get("txn-unknown", 0) == 0
    assert totals.get("crash", 0) == 0


def test_a_seed_replays_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    traces = []
    for _ in range(2):
        assert main(["--seed", "17", "--trace"]) == 0
        traces.append(capsys.readouterr().out)
    assert traces[0] == traces[1]
    assert traces[0].count("\nstep ") > 300
    assert "seed 17: ok" in traces[0]


def test_main_runs_many_seeds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seeds", "5", "--start", "100"]) == 0
    assert "5 seeds, 0 failed" in capsys.readouterr().out


# -- the checker has teeth: each broken core is caught, with a replay command ---------------


def _no_duplicate_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    original = ProducerStateManager.check_append

    def check_append(self: ProducerStateManager, header: object, **kwargs: object) -> None:
        original(self, header, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ProducerStateManager, "check_append", check_append)


def _lso_is_the_high_watermark(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ProducerStateManager, "last_stable_offset", lambda self, hw: hw)


def _aborted_index_forgets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(AbortedTxnIndex, "collect", lambda self, start, end: [])


def _abort_marker_commits_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    original = OffsetStore.replay_end_transaction
    monkeypatch.setattr(
        OffsetStore,
        "replay_end_transaction",
        lambda self, producer_id, committed: original(self, producer_id, True),
    )


def _stale_epochs_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ProducerStateManager, "check_marker", lambda self, *a, **k: None)
    original = ProducerStateManager.check_append

    def check_append(self: ProducerStateManager, header: object, **kwargs: object) -> object:
        try:
            return original(self, header, **kwargs)  # type: ignore[arg-type]
        except Exception as error:  # the epoch checks only
            if "epoch" in str(error):
                return None
            raise

    monkeypatch.setattr(ProducerStateManager, "check_append", check_append)


def _in_doubt_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TransactionCoordinator, "in_doubt", lambda self: [])


def _pending_offsets_look_stable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(OffsetStore, "pending_partitions", lambda self, group: set())


@pytest.mark.parametrize(
    ("break_core", "symptom"),
    [
        (_no_duplicate_detection, "appended twice"),
        (_lso_is_the_high_watermark, "passes the transaction open"),
        (_aborted_index_forgets, "never committed"),
        (_abort_marker_commits_offsets, "never committed"),
        (_stale_epochs_accepted, "fenced producer wrote again"),
        (_in_doubt_forgotten, "no quiescence"),
        (_pending_offsets_look_stable, "require_stable"),
    ],
    ids=lambda v: getattr(v, "__name__", "").strip("_") or v,
)
def test_a_broken_core_is_caught(
    monkeypatch: pytest.MonkeyPatch,
    break_core: Callable[[pytest.MonkeyPatch], None],
    symptom: str,
) -> None:
    break_core(monkeypatch)
    for seed in range(200):
        try:
            run_seed(seed)
        except SimulationFailure as failure:
            assert symptom in str(failure), str(failure)
            assert f"python -m onceflow.simulation --seed {seed}" in str(failure)
            return
    pytest.fail(f"no seed caught {break_core.__name__}")
