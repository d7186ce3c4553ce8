"""`onceflow bench --plot FILE`: the figures drawn as PNG, SVG or a self-contained page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from onceflow.bench.plot import BAR_ID, write_plot
from onceflow.bench.stats import BrokerCost, Phase
from onceflow.bench.throughput import Measurement


def measurements() -> list[Measurement]:
    found = []
    for target, rate in (("onceflow", 50_000.0), ("kafka", 80_000.0)):
        for size in (100, 1024):
            m = Measurement(target, size, 1000)
            m.produce_rounds = [Phase(1000, 1000 * size, 1000 / (rate * f)) for f in (0.9, 1, 1.1)]
            m.consume_rounds = [Phase(1000, 1000 * size, 1000 / (2 * rate))]
            windows = [(100, 2000.0 + 10 * i, 9000.0 + 50 * i) for i in range(5)]
            m.produce_costs = [BrokerCost(1000, None, 10, windows)]
            found.append(m)
    found.append(Measurement("broken", 100, 1000, error="no broker"))
    return found


def test_the_page_holds_a_median_bar_per_phase_and_workload(tmp_path: Path) -> None:
    path = tmp_path / "bench.html"
    write_plot(measurements(), path, "title", "onceflow bench --embedded --plot bench.html")
    page = path.read_text()
    assert page.startswith("<!doctype html>") and "<img" not in page
    bars = re.findall(rf'<g id="{BAR_ID}(\w+)-(\w+)-(\d+)"', page)
    assert sorted(bars) == sorted(
        (phase, target, str(size))
        for phase in ("produce", "consume")
        for target in ("onceflow", "kafka")
        for size in (100, 1024)
    )
    assert "onceflow bench --embedded --plot bench.html" in page
    assert "kafka 100 B p99" in page  # the round trips over time, per target
    assert "no broker" in page  # the failed workload is in the table, not drawn


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_pictures(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"bench{suffix}"
    write_plot(measurements(), path, "title", "")
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG" if suffix == ".png" else b"<svg")
    assert 5_000 < len(data) < 400_000


def test_other_suffixes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must end in"):
        write_plot(measurements(), tmp_path / "bench.pdf", "title", "")
