"""`onceflow bench-eos`: a tiny run prints every figure; the pieces it is made of behave."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from onceflow.bench.eos_figures import KAFKA_TARGETS, EosMeasurement, target_results
from onceflow.bench.eos_producer import TxnProducerReport, aborts
from onceflow.bench.stats import Latency, Phase, median_phase
from onceflow.cli.bench_eos import bench_eos_command
from onceflow.cli.root_group import OnceflowGroup
from tests.cli.harness import Outcome, closed_port_address


def _app() -> typer.Typer:
    # The command on its own root group, so these tests do not depend on main.py's wiring.
    app = typer.Typer(cls=OnceflowGroup, add_completion=False, pretty_exceptions_enable=False)
    app.command("bench-eos")(bench_eos_command)
    app.command("version")(lambda: None)  # a second command keeps bench-eos a subcommand
    return app


def run(*args: str) -> Outcome:
    result = CliRunner().invoke(_app(), ["bench-eos", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Outcome(result.exit_code, result.stdout, result.stderr)


def number(cell: str) -> float:
    return float(cell.replace(",", "").removesuffix(" ms").rstrip("x"))


RECORDS = 6000
PRODUCER_KINDS = ("plain", "idempotent", "transactional")
ISOLATIONS = ("read_uncommitted", "read_committed")
ROUNDS = 2
TINY_RUN = (
    "--records", str(RECORDS), "--rounds", str(ROUNDS), "--commit-interval-ms", "1",
    "--abort-ratio", "0.5",
    # A short local queue paces the producer by the broker, so 1 ms makes several transactions.
    "--producer-property", "queue.buffering.max.messages=500",
)  # fmt: skip


def test_tiny_run_prints_every_figure(bootstrap: str, tmp_path: Path) -> None:
    report = tmp_path / "eos.json"
    outcome = run("-b", f"base={bootstrap}", *TINY_RUN, "--json", str(report))
    assert outcome.exit_code == 0, outcome.stderr
    rows = outcome.table_rows(first_cell="base")

    producers = {row[1]: row[2:] for row in rows if row[1] in PRODUCER_KINDS}
    assert set(producers) == set(PRODUCER_KINDS)
    for records, rate, mb, _transactions in producers.values():
        assert number(records) == RECORDS
        assert number(rate) > 0 and number(mb) > 0
    committed, aborted = (int(w) for w in producers["transactional"][3].split()[::2])
    assert committed >= 1 and aborted >= 1
    assert producers["plain"][3] == producers["idempotent"][3] == "-"

    consumers = {row[1]: row[2:] for row in rows if row[1] in ISOLATIONS}
    assert number(consumers["read_uncommitted"][0]) == RECORDS
    # Aborted transactions are skipped by read_committed (and only those: checked below).
    assert 0 < number(consumers["read_committed"][0]) < RECORDS
    for _records, rate, mb, seconds in consumers.values():
        # a tiny read can take under 5 ms, which the table rounds to 0.00 s
        assert number(rate) > 0 and number(mb) > 0 and number(seconds) >= 0

    steps = (
        "commit_transaction()", "abort_transaction()", "flush before commit/abort",
        "begin to first record acked", "whole transaction",
    )  # fmt: skip
    latencies = {row[1]: row[2:] for row in rows if row[1] in steps}
    assert set(latencies) == set(steps)
    assert number(latencies["commit_transaction()"][0]) == committed
    assert number(latencies["abort_transaction()"][0]) == aborted
    for step in steps:
        _count, p50, p99, top = (number(cell) for cell in latencies[step])
        assert 0 <= p50 <= p99 <= top, step  # a flush can take under 0.05 ms
    assert number(latencies["commit_transaction()"][1]) > 0

    targets = [row for row in rows if len(row) == 5]
    assert [row[1] for row in targets] == [target.figure for target in KAFKA_TARGETS]
    for _, _, measured, target, result in targets:
        assert result in ("met", "not met")
        assert number(measured) > 0
        assert target.startswith((">=", "<"))

    document = json.loads(report.read_text())
    settings = document["settings"]
    assert (settings["records"], settings["rounds"], settings["abort_ratio"]) == (6000, 2, 0.5)
    assert settings["producer"]["acks"] == "all"
    assert settings["consumer"]["fetch.queue.backoff.ms"] == 10
    [result] = document["results"]
    assert result["target"] == "base" and result["error"] is None
    for kind in PRODUCER_KINDS:
        assert len(result["produce_rounds"][kind]) == ROUNDS
        assert result["produce"][kind]["records"] == RECORDS
    txns = result["transactions"]
    assert (txns["committed"], txns["aborted"]) == (committed, aborted)
    assert txns["committed_records"] + txns["aborted_records"] == RECORDS * ROUNDS
    assert txns["commit_latency_ms"]["count"] == committed
    assert txns["begin_to_first_ack_ms"]["count"] == committed + aborted
    topic = result["consumed_topic"]
    # Every round read read_committed to the end of every partition: exactly the committed.
    assert result["consume"]["read_committed"]["records"] == topic["committed_records"]
    assert result["consume"]["read_uncommitted"]["records"] == topic["records"] == RECORDS
    assert len(result["consume_rounds"]["read_committed"]) == ROUNDS
    assert [t["key"] for t in result["kafka_targets"]] == [t.key for t in KAFKA_TARGETS]
    assert all(isinstance(t["met"], bool) for t in result["kafka_targets"])


def test_a_failed_target_is_reported_and_a_started_broker_still_measured() -> None:
    dead = closed_port_address()
    outcome = run("-b", f"dead={dead}", "--embedded", "--records", "500", "--rounds", "1")
    assert outcome.exit_code == 1
    assert f"dead: Cannot reach a broker at {dead}" in outcome.stderr
    assert "Starting broker onceflow (fsync) (exactly-once)" in outcome.stderr
    assert outcome.stderr.rstrip().endswith("Error: 1 of 2 targets failed.")
    assert "Traceback" not in outcome.stderr
    [plain] = [row for row in outcome.table_rows(first_cell="dead") if row[1] == "plain"]
    assert plain[3].startswith(f"failed: Cannot reach a broker at {dead}")
    started = outcome.table_rows(first_cell="onceflow (fsync)")
    assert [row[2] for row in started if row[1] in PRODUCER_KINDS] == ["500"] * 3
    targets = [row for row in started if len(row) == 5]
    assert len(targets) == len(KAFKA_TARGETS)
    assert all(row[4] in ("met", "not met") for row in targets)


def test_bad_arguments() -> None:
    cases = {
        ("--abort-ratio", "1"): "--abort-ratio must be at least 0 and below 1",
        ("--abort-ratio", "-0.1"): "--abort-ratio must be at least 0 and below 1",
        ("--rounds", "0"): "--rounds must be at least 1",
        ("--commit-interval-ms", "0"): "--commit-interval-ms must be at least 1",
        ("--records", "0"): "--records must be at least 1",
        ("-b", "a=h:1", "-b", "a=h:2"): "Target names must differ",
        ("-b", "a=nohost"): "expected HOST:PORT",
    }
    for args, expected in cases.items():
        outcome = run(*args)
        assert outcome.exit_code == 2, (args, outcome.stderr)
        assert expected in outcome.assert_one_error_line(), (args, outcome.stderr)


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.25, 0.5, 0.9])
def test_aborted_transactions_are_spread_evenly(ratio: float) -> None:
    chosen = [i for i in range(100) if aborts(i, ratio)]
    assert len(chosen) == round(100 * ratio)
    for first in range(0, 100, 20):  # every stretch of 20 holds its share
        assert sum(aborts(i, ratio) for i in range(first, first + 20)) == round(20 * ratio)
    assert aborts(4, 0.1) and not any(aborts(i, 0.1) for i in (0, 1, 2, 3, 5, 9))


def test_latency_percentiles_are_nearest_rank() -> None:
    latency = Latency.of([float(ms) for ms in range(100, 0, -1)])
    assert latency == Latency(count=100, p50=50.0, p99=99.0, max=100.0)
    assert Latency.of([3.0]) == Latency(1, 3.0, 3.0, 3.0)
    assert Latency.of([]) is None


def test_median_phase_is_a_real_round() -> None:
    slow, mid, fast = Phase(10, 1000, 2.0), Phase(10, 1000, 1.0), Phase(10, 1000, 0.5)
    assert median_phase([fast, slow, mid]) is mid
    assert median_phase([fast, slow]) is slow  # the lower middle: no flattering
    assert median_phase([]) is None


def _measurement(
    plain: float, idempotent: float, txn: float, committed_s: float, commit_ms: list[float]
) -> EosMeasurement:
    m = EosMeasurement("t")
    for kind, seconds in (("plain", plain), ("idempotent", idempotent), ("transactional", txn)):
        m.produce_rounds[kind] = [Phase(1000, 100_000, seconds)]
    m.consume_rounds["read_uncommitted"] = [Phase(1000, 100_000, 1.0)]
    m.consume_rounds["read_committed"] = [Phase(900, 90_000, committed_s)]
    m.txn_reports.append(TxnProducerReport(commit_ms=commit_ms))
    return m


def test_kafka_targets_met_and_not_met() -> None:
    good = target_results(_measurement(1.0, 1.05, 1.08, 1.02, [2.0] * 99 + [9.9]))
    assert [(t.key, met) for t, _, met in good] == [(t.key, True) for t in KAFKA_TARGETS]
    values = {t.key: value for t, value, _ in good}
    assert values["idempotent_vs_plain"] == pytest.approx(1 / 1.05)
    # read_committed returned fewer records but read the same log: compared by time.
    assert values["read_committed_vs_read_uncommitted"] == pytest.approx(1 / 1.02)
    assert values["commit_p99_ms"] == 2.0

    bad = target_results(_measurement(1.0, 1.2, 1.3, 1.1, [2.0] * 98 + [10.0, 10.0]))
    assert [met for _, _, met in bad] == [False, False, False, False]

    empty = target_results(EosMeasurement("t"))
    assert [(value, met) for _, value, met in empty] == [(None, None)] * len(KAFKA_TARGETS)
