"""`onceflow bench`: a tiny run prints figures; the pieces it is made of behave."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from onceflow.cli.bench import (
    BenchError,
    BrokerProcess,
    Measurement,
    Phase,
    _settings,
    _split,
    parse_target,
    ratios,
    rss_bytes,
    tansu_binary,
)
from onceflow.cli.options import UsageError
from tests.cli.harness import Run, closed_port_address

COLUMNS = [
    "Target", "Value", "Records", "Produce rec/s", "Produce MB/s", "Consume rec/s",
    "Consume MB/s", "Produce vs base", "Consume vs base", "RSS max", "RSS end",
]  # fmt: skip


def number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("x"))


@pytest.mark.skipif(tansu_binary() is None, reason="no tansu executable")
def test_tiny_run_against_a_broker_and_a_started_one(
    run: Run, bootstrap: str, tmp_path: Path
) -> None:
    report = tmp_path / "bench.json"
    outcome = run(
        "bench", "-b", f"base={bootstrap}", "--tansu", "--records", "2000", "--producers", "2",
        "--idle-partitions", "10", "--json", str(report),
    )  # fmt: skip
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.lines[0].split() == " ".join(COLUMNS).split()

    rows = {(row[0], row[1]): row[2:] for row in outcome.table_rows() if len(row) == 11}
    assert set(rows) == {
        ("base", "100 B"), ("base", "1 KiB"), ("tansu (memory)", "100 B"),
        ("tansu (memory)", "1 KiB"),
    }  # fmt: skip
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
    [idle] = [row for row in outcome.table_rows() if len(row) == 4]
    assert idle[:2] == ["tansu (memory)", "10"]
    assert idle[2].endswith(" MiB") and idle[3].endswith(" MiB")
    assert "Starting broker tansu (memory) (throughput)" in outcome.stderr

    document = json.loads(report.read_text())
    assert document["baseline"] == "base"
    assert document["settings"]["producer"]["acks"] == "all"
    assert document["settings"]["producer"]["linger.ms"] == 5
    assert len(document["results"]) == 4
    for result in document["results"]:
        assert result["error"] is None
        for phase in ("produce", "consume"):
            assert result[phase]["records"] == 2000
            assert result[phase]["value_bytes"] == 2000 * result["value_size"]
            assert result[phase]["records_per_s"] > 0
        if result["target"] == "base":
            assert result["ratio_vs_baseline"] == {"produce": 1.0, "consume": 1.0}
            assert result["rss_max_bytes"] is None
        else:
            assert all(r > 0 for r in result["ratio_vs_baseline"].values())
            assert result["rss_max_bytes"] >= result["rss_end_bytes"] > 1_000_000
    [idle_figures] = document["idle"]
    assert idle_figures["partitions"] == 10
    assert idle_figures["rss_idle"] > 1_000_000


def test_a_failed_target_is_reported_and_the_others_still_measured(
    run: Run, bootstrap: str
) -> None:
    dead = closed_port_address()
    outcome = run(
        "bench", "-b", f"dead={dead}", "-b", f"ok={bootstrap}", "--records", "500",
        "--value-size", "100",
    )  # fmt: skip
    assert outcome.exit_code == 1
    [dead_row] = outcome.table_rows(first_cell="dead")
    assert dead_row[2] == "500"
    assert dead_row[3].startswith(f"failed: Cannot reach a broker at {dead}")
    [ok_row] = outcome.table_rows(first_cell="ok")
    assert number(ok_row[3]) > 0 and number(ok_row[5]) > 0
    assert ok_row[7:9] == ["-", "-"]  # no baseline figures to compare with
    assert f"dead: Cannot reach a broker at {dead}" in outcome.stderr
    assert outcome.stderr.rstrip().endswith("Error: 1 of 2 measurements failed.")
    assert "Traceback" not in outcome.stderr


def test_bad_arguments(run: Run) -> None:
    cases = {
        ("--producers", "0"): "--producers must be at least 1",
        ("--value-size", "0"): "--value-size must be at least 1",
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
    assert _settings([512], 7, 2, 6, 1, 0).records == {512: 7}
    assert _settings([10_000], None, 1, 6, 1, 0).records == {10_000: 20_000}
    with pytest.raises(UsageError):
        _settings(None, 0, 1, 6, 1, 0)


def test_split_shares_records_between_producers() -> None:
    assert _split(10, 3) == [4, 3, 3]
    assert _split(2, 4) == [1, 1]
    assert sum(_split(1_000_001, 2)) == 1_000_001


def test_targets_and_ratios() -> None:
    assert parse_target("127.0.0.1:9092").name == "127.0.0.1:9092"
    named = parse_target("kafka=h1:9092,h2:9092")
    assert (named.name, named.bootstrap) == ("kafka", "h1:9092,h2:9092")
    measurements = [
        Measurement("a", 100, 10, Phase(10, 1000, 1.0), Phase(10, 1000, 2.0)),
        Measurement("b", 100, 10, Phase(10, 1000, 0.5), Phase(10, 1000, 4.0)),
        Measurement("b", 1024, 10, Phase(10, 10240, 1.0), None, error="boom"),
    ]
    found = ratios(measurements, "a")
    assert found[("a", 100)] == (1.0, 1.0)
    assert found[("b", 100)] == (2.0, 0.5)
    assert found[("b", 1024)] == (None, None)  # the baseline has no 1 KiB figures


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
