"""`onceflow verify --apache-kafka DIR --nodes 3` for real: the verifier starts a 3-node Apache
Kafka cluster with exactly-once production settings and strikes its nodes (SIGKILL and restart,
SIGSTOP/SIGCONT, cut off from every client by the proxy) chosen as the leader of a workload
partition, a transaction coordinator, the group coordinator or at random, plus client pauses,
partitions and crashes: no anomaly, every fault kind injected, every kind of node struck.
The command line's own checks run without a cluster."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

from onceflow.apache_kafka import Distribution
from onceflow.verify.history import INVOKE, NEMESIS, OK, History
from onceflow.verify.kafka_nodes import NODE_ROLES, ManagedKafka
from tests.verify.runs import run_verify, verify_command

FAULTS = ("kill", "pause", "partition", "crash-client")
# Seed 7 deals a node fault of every role within the first six faults (tests/verify's
# test_kafka_nodes shows the deck; here the schedule must fit 60 s on a loaded machine).
SEED = "7"


def test_verify_apache_kafka_with_every_fault_finds_no_anomaly(
    tmp_path: Path, apache_kafka: Distribution
) -> None:
    report, _ = run_verify(
        tmp_path,
        *("--nodes", "3", "--duration", "60s", "--faults", ",".join(FAULTS), "--seed", SEED),
        *("--transaction-timeout-ms", "5000"),
        timeout=900,
        target=("--apache-kafka", str(apache_kafka.libs)),
    )
    assert report["valid"] and report["ok"], report
    assert set(report["anomalies"].values()) == {0}, report["anomalies"]
    assert report["target"] == f"apache-kafka {apache_kafka.version} x3"
    for kind in FAULTS:
        assert report["faults_injected"].get(kind, 0) >= 1, report["faults_injected"]
    assert all(report["node_faults"][role] >= 1 for role in NODE_ROLES), report["node_faults"]
    settings = report["details"]["apache_kafka"]["settings"]
    assert settings["min.insync.replicas"] == "2"
    assert settings["unclean.leader.election.enable"] == "false"
    operations = report["operations"]
    assert operations["committed"] >= 10 and operations["copy_transactions"] >= 1, operations
    assert report["details"]["copiers_drained"]  # committed input = committed output
    assert report["details"]["copy_group_type"] == "classic"  # listed so by Apache Kafka

    # The history names the nodes struck, each healed (restarted, resumed, reconnected).
    ops = [op for op in History.load(Path(report["history"])).ops if op.process == NEMESIS]
    struck = Counter(
        (op.f, op.type) for op in ops if str(op.value.get("target", "")).startswith("node ")
    )
    assert struck[("kill", INVOKE)] == struck[("kill", OK)] >= 1, struck
    assert struck[("pause", INVOKE)] + struck[("partition", INVOKE)] >= 1, struck


def usage_error(*args: str) -> str:
    done = subprocess.run(
        [*verify_command(), *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode != 0, done
    return done.stderr


def test_one_target_and_kafka_options_only_with_apache_kafka(
    tmp_path: Path, apache_kafka: Distribution
) -> None:
    assert "Choose one target" in usage_error(
        "--apache-kafka", "fetched", "--bootstrap-server", "127.0.0.1:1"
    )
    assert "--nodes and --override need --apache-kafka" in usage_error(
        "--embedded", "-o", "min.insync.replicas=1"
    )
    assert "expected KEY=VALUE" in usage_error("--apache-kafka", "fetched", "-o", "oops")
    nowhere = tmp_path / "no-kafka-here"
    nowhere.mkdir()
    stderr = usage_error("--apache-kafka", str(nowhere), "--duration", "1s")
    assert "cannot run Apache Kafka" in stderr and "neither Apache Kafka's libs/" in stderr


def test_overrides_win_and_only_nodes_that_exited_without_a_kill_are_errors(
    tmp_path: Path, apache_kafka: Distribution
) -> None:
    kafka = ManagedKafka(tmp_path, 3, apache_kafka, {"min.insync.replicas": "1"})
    assert kafka.settings["min.insync.replicas"] == "1"  # over the exactly-once settings
    assert kafka.settings["transaction.state.log.min.isr"] == "2"
    assert kafka.settings["transaction.abort.timed.out.transaction.cleanup.interval.ms"] == "1000"

    exited = subprocess.Popen(["sh", "-c", "exit 3"])  # died on its own
    killed = subprocess.Popen(["sleep", "60"])
    running = subprocess.Popen(["sleep", "60"])
    nodes = kafka.cluster.nodes
    nodes[1].process, nodes[2].process, nodes[3].process = exited, killed, running
    try:
        killed.kill()  # as the nemesis kills
        exited.wait(10)
        killed.wait(10)
        assert kafka.exited_on_their_own() == {1: 3}
    finally:
        for process in (exited, killed, running):
            process.kill()
            process.wait(10)
