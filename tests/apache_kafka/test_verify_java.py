"""`onceflow verify --embedded --client java --group-protocol consumer`: the producers and
copiers are Kafka's Java client 4.4 (TransactionalWorker.java), which uses transactions version
2, the copiers in a KIP-848 consumer group, while the broker is killed and the clients crashed:
no anomaly, version 2 really used (every writer's epoch at the coordinator bumped by every
transaction it ended), the group listed as a consumer group, and the same history, tampered
with, is flagged."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from onceflow.apache_kafka import Distribution
from onceflow.verify.checker import check
from onceflow.verify.history import FAIL, INVOKE, OK, TXN, UNKNOWN, WORKER, History, Op
from onceflow.verify.java_worker import ended_transactions, slot_of
from tests.verify.runs import assert_clean, run_verify, verify_command
from tests.verify.test_verify_run import tampered_final_read, tampered_outcome

KINDS = ("kill", "crash-client")


@pytest.fixture(scope="module")
def java_run(
    apache_kafka: Distribution, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], list[Op]]:
    """One short run, shared by the tests of this module: its report and its history."""
    tmp_path = tmp_path_factory.mktemp("verify-java")
    report, _ = run_verify(
        tmp_path,
        *("--duration", "30s", "--faults", ",".join(KINDS), "--seed", "7"),
        *("--client", "java", "--group-protocol", "consumer"),
        timeout=300,
    )
    return report, History.load(Path(report["history"])).ops


def test_verify_with_java_clients_on_version_2_and_kip_848_finds_no_anomaly(
    java_run: tuple[dict[str, Any], list[Op]],
) -> None:
    report, ops = java_run
    operations = assert_clean(report, KINDS)
    assert operations["copy_transactions"] >= 10, operations
    assert report["details"]["copiers_drained"]  # so committed input = committed output
    assert report["details"]["copy_group_type"] == "consumer"  # KIP-848, as the broker lists it
    # Every incarnation of a writer was the Java worker; the readers stayed Python.
    started = {
        op.process: op.value.get("client")
        for op in ops
        if op.f == WORKER and op.value.get("event") == "started"
    }
    writers = {p for p in started if p.startswith(("producer", "copier"))}
    assert writers and all(started[p] == "java" for p in writers), started
    assert all(started[p] is None for p in set(started) - writers), started
    # Version 2: the coordinator bumped each writer's epoch at every transaction it ended
    # (version 1 bumps it only at InitProducerId: a few times a run, not hundreds).
    java = report["details"]["java_client"]
    ended = ended_transactions(ops)
    assert java["ended_transactions"] == {name: ended[name] for name in java["epochs"]}, java
    assert set(java["epochs"]) == {slot_of(p) for p in writers}, java
    for name, epoch in java["epochs"].items():
        assert epoch >= ended[name], (name, java)
    producers = [name for name in java["epochs"] if name.startswith("producer")]
    assert producers and all(ended[name] >= 20 for name in producers), java
    assert java["version_2"], java


def test_checker_flags_what_is_planted_in_the_java_history(
    java_run: tuple[dict[str, Any], list[Op]],
) -> None:
    _, ops = java_run
    assert check(ops).valid  # the file says what the run said
    tampered_outcome(ops)  # a committed transaction said to have failed: aborted reads
    tampered_final_read(ops)  # a committed value dropped from the final read: a lost write


def test_verify_without_java_says_so_in_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    done = subprocess.run(
        [*verify_command(), "--embedded", "--client", "java", "--duration", "5s", "-f", "none"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PATH": str(empty)},  # no java on it
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    # One line, the last: said before anything starts.
    expected = "Error: cannot run the Java client: java is not installed (Apache Kafka needs Java"
    assert done.stderr.strip().splitlines()[-1] == f"{expected} 17 or later)", done.stderr


def test_ended_transactions_counts_only_sure_ends() -> None:
    """The evidence counts a transaction only if it surely reached the coordinator with its
    partitions added: committed, or aborted on purpose with every write delivered."""
    history = History()
    w = ["t", 0, "v"]

    def txn(process: str, name: str, outcome: str, error: str | None, delivered: int) -> None:
        history.append(process, INVOKE, TXN, {"txn": name, "writes": [w, w]})
        done = {"txn": name, "delivered": [["t", 0, i, "v"] for i in range(delivered)]}
        history.append(process, outcome, TXN, {**done, "error": error})

    txn("producer0#1", "a", OK, None, 2)
    txn("producer0#1", "b", FAIL, "aborted on purpose", 2)
    txn("producer0#1", "c", FAIL, "aborted on purpose", 1)  # a write refused
    txn("producer0#1", "d", FAIL, "KafkaException: fenced", 2)
    txn("producer0#2", "e", UNKNOWN, "TimeoutException", 2)
    txn("copier1#3", "f", OK, None, 2)
    history.append("producer0#2", INVOKE, TXN, {"txn": "g", "writes": [w]})
    history.crashed("producer0#2", "crashed (SIGKILL)")
    assert ended_transactions(history.ops) == {"producer0": 2, "copier1": 1}
