"""`onceflow bench`: a tiny run prints figures; the pieces it is made of behave."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.progress import Progress

import onceflow.bench.throughput_run as bench
from onceflow.bench.errors import BenchError
from onceflow.bench.plot import BAR_ID
from onceflow.bench.producers import split_records as _split
from onceflow.bench.stats import Phase
from onceflow.bench.targets import BrokerProcess, parse_target, rss_bytes
from onceflow.bench.throughput import Measurement, ratios
from onceflow.bench.throughput import bench_settings as _settings
from onceflow.bench.throughput_run import BenchRun, LiveTarget
from onceflow.tools.clients import Cluster
from onceflow.tools.errors import UsageError
from tests.cli.harness import Run, closed_port_address

COLUMNS = [
    "Target", "Value", "Records", "Produce rec/s", "Produce MB/s", "Consume rec/s",
    "Consume MB/s", "Produce vs base", "Consume vs base", "RSS max", "RSS end",
]  # fmt: skip


def number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("x"))


STARTED = ("onceflow (fsync)", "onceflow (no fsync)")


def test_tiny_run_against_a_broker_and_started_ones(
    run: Run, bootstrap: str, tmp_path: Path
) -> None:
    """The brokers the bench starts are onceflow's (--embedded): a run in CI must not hang on a
    third-party broker (Tansu stalled a consume once in CI); --tansu starts the same way."""
    report = tmp_path / "bench.json"
    outcome = run(
        "bench", "-b", f"base={bootstrap}", "--embedded", "--records", "2000", "--producers", "2",
        "--idle-partitions", "10", "--json", str(report), "--plot", str(tmp_path / "bench.html"),
    )  # fmt: skip
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.lines[0].split() == " ".join(COLUMNS).split()

    rows = {(row[0], row[1]): row[2:] for row in outcome.table_rows() if len(row) == 11}
    assert set(rows) == {(t, size) for t in ("base", *STARTED) for size in ("100 B", "1 KiB")}
    for (target, _size), cells in rows.items():
        records, p_rate, p_mb, c_rate, c_mb, p_ratio, c_ratio, rss_max, rss_end = cells
        assert records == "2,000"
        assert min(number(p_rate), number(p_mb), number(c_rate), number(c_mb)) > 0
        if target == "base":
            assert (p_ratio, c_ratio, rss_max, rss_end) == ("1.00x", "1.00x", "-", "-")
        else:
            # the table rounds to 0.01x; the JSON below checks the exact ratios are > 0
            assert p_ratio.endswith("x") and c_ratio.endswith("x")
            assert rss_max.endswith(" MiB") and rss_end.endswith(" MiB")
    idle = [row for row in outcome.table_rows() if len(row) == 4]
    assert [row[:2] for row in idle] == [[t, "10"] for t in STARTED]
    assert all(row[2].endswith(" MiB") and row[3].endswith(" MiB") for row in idle)
    assert "Starting broker onceflow (fsync) (throughput)" in outcome.stderr

    document = json.loads(report.read_text())
    assert document["baseline"] == "base"
    assert document["settings"]["rounds"] == 3  # the default
    assert document["settings"]["producer"]["acks"] == "all"
    assert document["settings"]["producer"]["linger.ms"] == 5
    assert len(document["results"]) == 6
    for result in document["results"]:
        assert result["error"] is None
        for phase in ("produce", "consume"):
            assert result[phase]["records"] == 2000
            assert result[phase]["value_bytes"] == 2000 * result["value_size"]
            assert result[phase]["records_per_s"] > 0
        assert len(result["produce_rounds"]) == len(result["consume_rounds"]) == 3
        assert len(result["rss_rounds"]) == 3
        if result["target"] == "base":
            assert result["ratio_vs_baseline"] == {"produce": 1.0, "consume": 1.0}
            assert result["rss_max_bytes"] is None
            no_rss = {"rss_max_bytes": None, "rss_end_bytes": None}
            assert result["rss_rounds"] == [no_rss] * 3
        else:
            assert all(r > 0 for r in result["ratio_vs_baseline"].values())
            assert result["rss_max_bytes"] >= result["rss_end_bytes"] > 1_000_000
            peaks = [r["rss_max_bytes"] for r in result["rss_rounds"]]
            assert result["rss_max_bytes"] == max(peaks)
            assert result["rss_end_bytes"] == result["rss_rounds"][-1]["rss_end_bytes"]
    assert [figures["partitions"] for figures in document["idle"]] == [10, 10]
    assert all(figures["rss_idle"] > 1_000_000 for figures in document["idle"])
    page = (tmp_path / "bench.html").read_text()  # --plot: a median bar per phase and workload
    for result in document["results"]:
        for phase in ("produce", "consume"):
            assert f'id="{BAR_ID}{phase}-{result["target"]}-{result["value_size"]}"' in page


def test_rounds_interleave_targets_and_the_table_shows_the_median(
    run: Run, bootstrap: str, tmp_path: Path
) -> None:
    report = tmp_path / "bench.json"
    outcome = run(
        "bench", "-b", f"a={bootstrap}", "-b", f"b={bootstrap}", "--records", "300",
        "--rounds", "2", "--json", str(report),
    )  # fmt: skip
    assert outcome.exit_code == 0, outcome.stderr
    assert "a 100 B 2/2 produce" in outcome.stderr  # the progress line names the round

    document = json.loads(report.read_text())
    assert document["settings"]["rounds"] == 2
    results = {(r["target"], r["value_size"]): r for r in document["results"]}
    assert set(results) == {("a", 100), ("a", 1024), ("b", 100), ("b", 1024)}
    rows = {(row[0], row[1]): row[2:] for row in outcome.table_rows() if len(row) == 11}
    for (target, size), result in results.items():
        assert result["error"] is None
        for phase in ("produce", "consume"):
            rounds = result[f"{phase}_rounds"]
            assert len(rounds) == 2
            assert all(r["records"] == 300 for r in rounds)
            # Two rounds: the median is the lower middle one, the slower round.
            assert result[phase] == min(rounds, key=lambda r: r["records_per_s"])
        cells = rows[(target, "100 B" if size == 100 else "1 KiB")]
        # the table shows the median's rate (the JSON rounds it to 0.1)
        assert abs(number(cells[1]) - result["produce"]["records_per_s"]) <= 1
        assert abs(number(cells[3]) - result["consume"]["records_per_s"]) <= 1
        # ratios are medians over medians
        base = results[("a", size)]
        for phase in ("produce", "consume"):
            expected = result[phase]["records_per_s"] / base[phase]["records_per_s"]
            assert result["ratio_vs_baseline"][phase] == pytest.approx(expected, rel=1e-3)
        assert cells[5:7] == [
            f"{result['ratio_vs_baseline'][phase]:.2f}x" for phase in ("produce", "consume")
        ]


def test_a_failed_target_is_reported_and_the_others_still_measured(
    run: Run, bootstrap: str
) -> None:
    dead = closed_port_address()
    outcome = run(
        "bench", "-b", f"dead={dead}", "-b", f"ok={bootstrap}", "--records", "500",
        "--value-size", "100",
    )  # fmt: skip
    assert outcome.exit_code == 1
    # the results table's rows (the cost table below it has rows of 8 cells)
    [dead_row] = [row for row in outcome.table_rows(first_cell="dead") if len(row) == 11]
    assert dead_row[2] == "500"
    assert dead_row[3].startswith(f"failed: Cannot reach a broker at {dead}")
    [ok_row] = [row for row in outcome.table_rows(first_cell="ok") if len(row) == 11]
    assert number(ok_row[3]) > 0 and number(ok_row[5]) > 0
    assert ok_row[7:9] == ["-", "-"]  # no baseline figures to compare with
    assert f"dead: Cannot reach a broker at {dead}" in outcome.stderr
    assert outcome.stderr.rstrip().endswith("Error: 1 of 2 measurements failed.")
    assert "Traceback" not in outcome.stderr


def test_bad_arguments(run: Run) -> None:
    cases = {
        ("--producers", "0"): "--producers must be at least 1",
        ("--value-size", "0"): "--value-size must be at least 1",
        ("--rounds", "0"): "--rounds must be at least 1, not 0",
        ("-b", "a=h:1", "-b", "a=h:2"): "Target names must differ",
        ("-b", "a=h:1", "--baseline", "b"): "--baseline 'b' is not a target",
        ("-b", "=h:1",): "the name is empty",
        ("-b", "a=nohost",): "expected HOST:PORT",
    }  # fmt: skip
    for args, expected in cases.items():
        outcome = run("bench", *args)
        assert outcome.exit_code == 2, (args, outcome.stderr)
        assert expected in outcome.assert_one_error_line(), (args, outcome.stderr)


def test_settings_defaults_and_overrides() -> None:
    defaults = _settings(None, None, 1, 6, 1, 0)
    assert defaults.value_sizes == [100, 1024]
    assert defaults.records == {100: 1_000_000, 1024: 200_000}
    assert defaults.rounds == 3
    assert _settings([512], 7, 2, 6, 1, 0, 5).rounds == 5
    assert _settings([512], 7, 2, 6, 1, 0).records == {512: 7}
    assert _settings([10_000], None, 1, 6, 1, 0).records == {10_000: 20_000}
    with pytest.raises(UsageError):
        _settings(None, 0, 1, 6, 1, 0)
    with pytest.raises(UsageError, match="--rounds must be at least 1"):
        _settings(None, None, 1, 6, 1, 0, 0)


def test_split_shares_records_between_producers() -> None:
    assert _split(10, 3) == [4, 3, 3]
    assert _split(2, 4) == [1, 1]
    assert sum(_split(1_000_001, 2)) == 1_000_001


def test_targets_and_ratios() -> None:
    assert parse_target("127.0.0.1:9092").name == "127.0.0.1:9092"
    named = parse_target("kafka=h1:9092,h2:9092")
    assert (named.name, named.bootstrap) == ("kafka", "h1:9092,h2:9092")
    measurements = [
        Measurement("a", 100, 10, [Phase(10, 1000, 1.0)], [Phase(10, 1000, 2.0)]),
        # medians: produce 0.5 s (of 0.4, 0.5, 3.0), consume 4.0 s (the lower middle of two)
        Measurement(
            "b", 100, 10, [Phase(10, 1000, s) for s in (3.0, 0.4, 0.5)],
            [Phase(10, 1000, s) for s in (1.0, 4.0)],
        ),
        Measurement("b", 1024, 10, [Phase(10, 10240, 1.0)], [], error="boom"),
    ]  # fmt: skip
    found = ratios(measurements, "a")
    assert found[("a", 100)] == (1.0, 1.0)
    assert found[("b", 100)] == (2.0, 0.5)
    assert found[("b", 1024)] == (None, None)  # the baseline has no 1 KiB figures


def test_a_measurement_shows_its_median_round_and_rss_over_rounds() -> None:
    slow, mid, fast = Phase(10, 1000, 2.0), Phase(10, 1000, 1.0), Phase(10, 1000, 0.5)
    m = Measurement("t", 100, 10, [fast, slow, mid], [fast, slow])
    assert m.produce is mid
    assert m.consume is slow  # two rounds: the lower middle, as bench-eos
    assert Measurement("t", 100, 10).produce is None
    assert (m.rss_max, m.rss_end) == (None, None)
    m.rss_rounds = [(300, 200), (500, 100), (400, 250)]
    assert (m.rss_max, m.rss_end) == (500, 250)  # highest of any round; end of the last
    m.rss_rounds = [(None, None)]
    assert (m.rss_max, m.rss_end) == (None, None)


def test_rounds_take_every_target_in_turn_and_drop_a_failed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Round 1: each size, each target; round 2 alike. A target failing is left out."""
    order: list[tuple[int, int, str]] = []

    def measure_one(_run: BenchRun, target: LiveTarget, m: Measurement, number: int) -> None:
        order.append((number, m.value_size, m.target))
        if (number, m.value_size, m.target) == (2, 100, "b"):
            raise BenchError("b broke")
        m.produce_rounds.append(Phase(10, 1000, 1.0))
        m.consume_rounds.append(Phase(10, 1000, 1.0))

    connected: list[Cluster] = []

    def connect_admin(cluster: Cluster) -> object:
        connected.append(cluster)
        return object()  # only _measure_one uses the session, and it is replaced too

    monkeypatch.setattr(bench, "connect_admin", connect_admin)
    monkeypatch.setattr(BenchRun, "_measure_one", measure_one)
    settings = _settings([100, 1024], 10, 1, 1, 1, 0, 3)
    run = BenchRun(settings, Progress(console=Console(file=io.StringIO())))
    run.measure([parse_target(f"{name}=h:1") for name in ("a", "b", "c")])

    assert connected == [Cluster("h:1")] * 3  # every target connected before the first round
    round_one = [(1, size, t) for size in (100, 1024) for t in ("a", "b", "c")]
    round_two = [(2, 100, "a"), (2, 100, "b"), (2, 100, "c"), (2, 1024, "a"), (2, 1024, "c")]
    round_three = [(3, size, t) for size in (100, 1024) for t in ("a", "c")]
    assert order == round_one + round_two + round_three
    errors = {(m.target, m.value_size): m.error for m in run.measurements}
    assert errors == {
        ("a", 100): None, ("a", 1024): None, ("b", 100): "b broke", ("b", 1024): "b broke",
        ("c", 100): None, ("c", 1024): None,
    }  # fmt: skip
    assert [len(m.consume_rounds) for m in run.measurements] == [3, 3, 1, 1, 3, 3]


def fake_broker(tmp_path: Path, script: str) -> BrokerProcess:
    return BrokerProcess("fake", [sys.executable, "-c", script], tmp_path)


def test_started_broker_is_ready_when_it_says_so(tmp_path: Path) -> None:
    broker = fake_broker(
        tmp_path, "import time; print('booting'); print('broker ready', flush=True); time.sleep(60)"
    )
    try:
        broker.wait_ready(20)
        assert broker.rss() is not None and broker.rss() > 0
    finally:
        broker.stop(grace_s=5)
    assert broker.process.returncode is not None
    assert broker.rss() is None


def test_started_broker_that_dies_says_why(tmp_path: Path) -> None:
    broker = fake_broker(tmp_path, "import sys; sys.exit('cannot bind 127.0.0.1:1: denied')")
    try:
        with pytest.raises(BenchError, match="exited with code 1 before it was ready: cannot bind"):
            broker.wait_ready(20)
    finally:
        broker.stop()


def test_rss_of_this_process() -> None:
    assert rss_bytes(os.getpid()) > 1_000_000
