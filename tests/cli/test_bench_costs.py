"""What a benchmark says a broker's work cost: CPU time from /proc, librdkafka's statistics
read for Produce requests and round trips, and the medians the tables show."""

from __future__ import annotations

import json
import os
import time

from onceflow.bench.client_stats import ClientStats
from onceflow.bench.stats import BrokerCost, CostSummary
from onceflow.bench.targets import cpu_seconds


def stats_json(produce: int, windows: list[tuple[int, float, float]]) -> str:
    """librdkafka's statistics as it emits them: a bootstrap placeholder (node id -1) and
    one entry per broker it learnt of."""
    brokers = {
        "127.0.0.1:9092/bootstrap": {
            "nodeid": -1,
            "req": {"Produce": 99},
            "rtt": {"cnt": 5, "p50": 1.0, "p99": 2.0},
        }
    }
    for i, (cnt, p50, p99) in enumerate(windows):
        brokers[f"127.0.0.1:9092/{i}"] = {
            "nodeid": i,
            "req": {"Produce": produce, "Metadata": 3},
            "rtt": {"cnt": cnt, "p50": p50, "p99": p99},
        }
    return json.dumps({"brokers": brokers})


def test_client_stats_count_produce_requests_and_keep_windows_once_started() -> None:
    stats = ClientStats()
    assert stats.settings()["stats_cb"] == stats.on_stats
    stats.on_stats(stats_json(1, [(10, 500.0, 900.0)]))  # connecting: not a window
    stats.start()
    stats.on_stats(stats_json(40, [(30, 700.0, 1500.0), (0, 0.0, 0.0)]))
    stats.on_stats(stats_json(60, [(20, 800.0, 2500.0)]))
    assert stats.emissions == 3
    assert stats.produce_requests == 60  # cumulative, placeholders left out
    assert stats.windows == [(30, 700.0, 1500.0), (20, 800.0, 2500.0)]


def test_final_waits_for_one_more_emission_and_no_longer() -> None:
    stats = ClientStats()
    polls: list[float] = []

    def poll(timeout: float) -> None:
        polls.append(timeout)
        if len(polls) == 3:
            stats.on_stats(stats_json(7, [(1, 100.0, 200.0)]))

    stats.final(poll)
    assert len(polls) == 3 and stats.produce_requests == 7
    started = time.monotonic()
    stats.final(lambda _timeout: None, timeout_s=0.2)  # nothing comes: gives up
    assert time.monotonic() - started < 5


def test_cost_summary_is_the_median_round_and_the_median_window() -> None:
    rounds = [
        BrokerCost(1000, 0.5, 100, [(50, 1000.0, 4000.0), (50, 3000.0, 9000.0)]),
        BrokerCost(1000, 0.2, 50, [(40, 2000.0, 5000.0)]),
        BrokerCost(1000, None, 80, None),  # a broker not started here: no CPU figure
    ]
    summary = CostSummary.of(rounds)
    # us per request: 5000 and 4000 -> the lower middle; per record: 500, 200 -> 200
    assert summary.cpu_us_per_request == 4000
    assert summary.cpu_us_per_record == 200
    assert summary.requests == 80
    assert (summary.rtt_p50_ms, summary.rtt_p99_ms) == (2.0, 5.0)
    empty = CostSummary.of([])
    assert empty == CostSummary(None, None, None, None, None)
    assert set(summary.as_json()) == {
        "cpu_us_per_produce_request", "cpu_us_per_record", "produce_requests",
        "ack_rtt_p50_ms", "ack_rtt_p99_ms",
    }  # fmt: skip


def test_cpu_seconds_of_a_process_grow_as_it_works() -> None:
    before = cpu_seconds(os.getpid())
    assert before is not None
    deadline = time.monotonic() + 30
    while (after := cpu_seconds(os.getpid())) == before and time.monotonic() < deadline:
        sum(range(100_000))  # burn CPU until the next clock tick shows it
    assert after is not None and after > before
    assert cpu_seconds(2**22 + 1) is None  # above pid_max's default: no such process
