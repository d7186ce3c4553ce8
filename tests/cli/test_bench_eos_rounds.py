"""`onceflow bench-eos` measures its targets in rounds, interleaved within each (every broker
up from the first round to the last), and leaves a failed target out of what remains."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.progress import Progress

import onceflow.bench.eos_run as eos_run
from onceflow.bench.eos_run import EosRun, EosSettings, LiveEosTarget
from onceflow.bench.errors import BenchError
from onceflow.bench.targets import parse_target


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

    connected: list[str] = []

    def connect_admin(address: str) -> object:
        connected.append(address)
        return object()

    monkeypatch.setattr(eos_run, "connect_admin", connect_admin)
    monkeypatch.setattr(eos_run, "delete_topic", lambda _session, _topic: None)
    monkeypatch.setattr(EosRun, "_produce_round", produce_round)
    monkeypatch.setattr(EosRun, "_consume_round", consume_round)
    settings = EosSettings(10, 100, 1, 1, 1, 100, 0.1, 3)
    run = EosRun(settings, Progress(console=Console(file=io.StringIO())))
    run.measure([parse_target(f"{name}=h:1") for name in ("a", "b", "c")])

    assert connected == ["h:1"] * 3  # every target connected before the first round
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
