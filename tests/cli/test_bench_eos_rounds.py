"""`onceflow bench-eos` measures its targets in rounds, interleaved within each (every broker
up from the first round to the last), and leaves a failed target out of what remains; bench
and bench-eos run their warm-up rounds first and drop their figures."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.progress import Progress

import onceflow.bench.eos_run as eos_run
import onceflow.bench.throughput_run as throughput_run
from onceflow.bench.eos_run import EosRun, EosSettings, LiveEosTarget
from onceflow.bench.errors import BenchError
from onceflow.bench.stats import Phase
from onceflow.bench.targets import parse_target
from onceflow.bench.throughput import Measurement, bench_settings
from onceflow.bench.throughput_run import BenchRun, LiveTarget
from onceflow.tools.clients import Cluster


def test_rounds_take_every_target_in_turn_and_drop_a_failed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    order: list[tuple[str, int, str]] = []

    def produce_round(_run: EosRun, target: LiveEosTarget, number: int) -> None:
        order.append(("produce", number, target.spec.name))
        if (number, target.spec.name) == (2, "b"):
            raise BenchError("b broke")
        target.kept = ("topic", 1)

    def consume_round(_run: EosRun, target: LiveEosTarget, number: int) -> None:
        order.append(("consume", number, target.spec.name))

    connected: list[Cluster] = []

    def connect_admin(cluster: Cluster) -> object:
        connected.append(cluster)
        return object()

    monkeypatch.setattr(eos_run, "connect_admin", connect_admin)
    monkeypatch.setattr(eos_run, "delete_topic", lambda _session, _topic: None)
    monkeypatch.setattr(EosRun, "_produce_round", produce_round)
    monkeypatch.setattr(EosRun, "_consume_round", consume_round)
    settings = EosSettings(10, 100, 1, 1, 1, 100, 0.1, 3)
    run = EosRun(settings, Progress(console=Console(file=io.StringIO())))
    run.measure([parse_target(f"{name}=h:1") for name in ("a", "b", "c")])

    assert connected == [Cluster("h:1")] * 3  # every target connected before the first round
    assert order == [
        ("produce", 1, "a"), ("produce", 1, "b"), ("produce", 1, "c"),
        ("produce", 2, "a"), ("produce", 2, "b"), ("produce", 2, "c"),
        ("produce", 3, "a"), ("produce", 3, "c"),
        ("consume", 1, "a"), ("consume", 1, "c"),
        ("consume", 2, "a"), ("consume", 2, "c"),
        ("consume", 3, "a"), ("consume", 3, "c"),
    ]  # fmt: skip
    assert [(m.target, m.error) for m in run.measurements] == [
        ("a", None), ("b", "b broke"), ("c", None)
    ]  # fmt: skip


def test_warm_up_rounds_run_first_for_every_target_and_their_figures_are_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bench and bench-eos alike: round 0 warms every target up (a JVM compiles then)."""
    seen: list[tuple[int, str, bool]] = []

    def measure_one(run: BenchRun, target: LiveTarget, m: Measurement, number: int) -> None:
        seen.append((number, m.target, any(m is kept for kept in run.measurements)))
        m.produce_rounds.append(Phase(10, 1000, float(1 + (number < 1))))
        m.consume_rounds.append(Phase(10, 1000, 1.0))

    monkeypatch.setattr(throughput_run, "connect_admin", lambda _address: object())
    monkeypatch.setattr(BenchRun, "_measure_one", measure_one)
    settings = bench_settings([100], 10, 1, 1, 1, 0, 2)
    settings.warm_up_rounds = 1
    run = BenchRun(settings, Progress(console=Console(file=io.StringIO())))
    run.measure([parse_target(f"{name}=h:1") for name in ("a", "b")])
    assert seen == [(0, "a", False), (0, "b", False), (1, "a", True), (1, "b", True),
                    (2, "a", True), (2, "b", True)]  # fmt: skip
    assert [len(m.produce_rounds) for m in run.measurements] == [2, 2]
    assert all(p.seconds == 1.0 for m in run.measurements for p in m.produce_rounds)

    eos: list[tuple[int, str, bool]] = []

    def produce_round(eos_self: EosRun, target: LiveEosTarget, number: int) -> None:
        eos.append((number, target.spec.name, number >= 1))
        target.kept = ("topic", 1)

    monkeypatch.setattr(eos_run, "connect_admin", lambda _address: object())
    monkeypatch.setattr(eos_run, "delete_topic", lambda _session, _topic: None)
    monkeypatch.setattr(EosRun, "_produce_round", produce_round)
    monkeypatch.setattr(EosRun, "_consume_round", lambda *_: None)
    eos_settings = EosSettings(10, 100, 1, 1, 1, 100, 0.1, 1, warm_up_rounds=1)
    EosRun(eos_settings, Progress(console=Console(file=io.StringIO()))).measure(
        [parse_target("a=h:1"), parse_target("b=h:1")]
    )
    assert eos == [(0, "a", False), (0, "b", False), (1, "a", True), (1, "b", True)]
