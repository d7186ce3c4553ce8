"""`onceflow bench` and `bench-eos` with Apache Kafka as a target (--apache-kafka): tiny runs
against one started node (with fsync per write, and with Kafka's defaults), every Kafka row
present with figures above zero, the cost table (broker CPU, Produce round trips) filled in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onceflow.apache_kafka import Distribution
from onceflow.bench.kafka_target import KafkaNodeBroker, kafka_targets
from onceflow.tools.errors import UsageError
from tests.cli.harness import invoke

KAFKA_TARGETS = ("kafka (fsync)", "kafka (no fsync)")


def number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("x"))


def test_bench_measures_apache_kafka(apache_kafka: Distribution, tmp_path: Path) -> None:
    """One node (a JVM with C2 takes a while to start on a loaded machine): the fsync one here,
    the other in bench-eos's test below; the launcher test checks both targets' settings."""
    report = tmp_path / "bench.json"
    outcome = invoke(
        "bench", "--apache-kafka", str(apache_kafka.libs), "--apache-kafka-durability", "fsync",
        "--records", "3000", "--value-size", "100", "--rounds", "1", "--json", str(report),
    )  # fmt: skip
    assert outcome.exit_code == 0, outcome.stderr
    rows = outcome.table_rows()
    results = {row[0]: row for row in rows if len(row) == 11}
    costs = {row[0]: row for row in rows if len(row) == 8}
    # --apache-kafka alone: only Kafka, no onceflow broker
    assert list(results) == list(costs) == ["kafka (fsync)"]
    for target in results:
        _, value, records, p_rate, _, c_rate, _, _, _, rss_max, _ = results[target]
        assert (value, records) == ("100 B", "3,000")
        assert number(p_rate) > 0 and number(c_rate) > 0
        assert rss_max.endswith(" MiB")
        _, _, requests, cpu_request, cpu_record, _, p50, p99 = costs[target]
        assert number(requests) > 0 and number(cpu_request) > 0 and number(cpu_record) > 0
        assert 0 < number(p50) <= number(p99)
    assert "Starting broker kafka (fsync) (throughput)" in outcome.stderr

    document = json.loads(report.read_text())
    for result in document["results"]:
        cost = result["produce_cost"]
        assert cost["cpu_us_per_produce_request"] > 0 and cost["produce_requests"] > 0
        assert result["consume_cost"]["cpu_us_per_record"] is not None
        [round_cost] = result["produce_cost_rounds"]
        assert round_cost["cpu_s"] > 0 and round_cost["rtt_windows"]


def test_bench_eos_measures_apache_kafka(apache_kafka: Distribution) -> None:
    outcome = invoke(
        "bench-eos", "--apache-kafka", str(apache_kafka.libs), "--apache-kafka-durability",
        "defaults", "--records", "3000", "--rounds", "1", "--abort-ratio", "0.5",
        "--commit-interval-ms", "5", "--producer-property", "queue.buffering.max.messages=500",
    )  # fmt: skip
    assert outcome.exit_code == 0, outcome.stderr
    rows = outcome.table_rows(first_cell="kafka (no fsync)")
    assert not outcome.table_rows(first_cell="kafka (fsync)")
    producers = {row[1]: row for row in rows if len(row) == 6 and row[1].isalpha()}
    for kind in ("plain", "idempotent", "transactional"):
        assert number(producers[kind][2]) == 3000 and number(producers[kind][3]) > 0
    costs = {row[1]: row for row in rows if len(row) == 7}
    for kind in ("plain", "idempotent", "transactional"):
        _, _, requests, cpu_request, cpu_record, p50, p99 = costs[f"{kind} produce"]
        assert number(requests) > 0 and number(cpu_request) > 0 and number(cpu_record) > 0
        assert 0 < number(p50) <= number(p99)
    for isolation in ("read_committed", "read_uncommitted"):
        assert costs[f"{isolation} consume"][4] != "-"


def test_the_fsync_target_flushes_every_message_and_the_other_keeps_kafkas_defaults(
    apache_kafka: Distribution, tmp_path: Path
) -> None:
    """Launched (not started): the node's settings, its JVM with C2 and a benchmark's heap."""
    fsync, defaults = kafka_targets(str(apache_kafka.libs), "both")
    assert (fsync.name, defaults.name) == KAFKA_TARGETS
    assert fsync.launch is not None and defaults.launch is not None
    broker, bootstrap = fsync.launch(fsync.name, tmp_path / "a")
    assert isinstance(broker, KafkaNodeBroker)
    assert broker.cluster.settings["log.flush.interval.messages"] == "1"
    assert broker.cluster.bootstrap_servers == bootstrap
    assert (broker.cluster.heap, broker.cluster.jvm_options) == ("1g", ())
    broker, _ = defaults.launch(defaults.name, tmp_path / "b")
    assert isinstance(broker, KafkaNodeBroker)
    assert "log.flush.interval.messages" not in broker.cluster.settings
    assert [spec.name for spec in kafka_targets("fetched", "fsync")] == ["kafka (fsync)"]
    assert kafka_targets(None, "both") == []
    with pytest.raises(UsageError, match="--apache-kafka-durability must be one of"):
        kafka_targets("fetched", "sometimes")
    with pytest.raises(UsageError, match=r"--apache-kafka: .* neither Apache Kafka.s libs/"):
        kafka_targets(str(tmp_path), "both")
