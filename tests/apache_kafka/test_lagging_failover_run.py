"""The faults bite: `onceflow verify --apache-kafka --faults lagging-failover` strands the
leader of a workload partition alone in its ISR (its followers' fetches cut), lets the workload
write, SIGKILLs it and restarts it once another leader is elected or a deadline passed.
- With unsafe settings (min.insync.replicas=1, unclean.leader.election.enable=true) the lone
  leader acknowledges writes that no follower has, a stale follower is elected uncleanly, and
  the checker reports the acknowledged writes gone (lost-write): what Kafka itself loses so.
- With the exactly-once production settings the same fault loses nothing.
replica.lag.time.max.ms=3000 (Kafka: 30 s) so that the ISR shrinks within a short run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from onceflow.apache_kafka import Distribution
from onceflow.verify.faults import LAGGING_FAILOVER
from tests.verify.runs import verify_command

UNSAFE = ("-o", "unclean.leader.election.enable=true", "-o", "min.insync.replicas=1")
QUICK_ISR = ("-o", "replica.lag.time.max.ms=3000")
UNCLEAN_ELECTION = "using an unclean election"  # the controller's log line
# A run is 60 s, but the cluster's start took 180 s once at a load average of 64 (2-5 min).
RUN_TIMEOUT_S = 900


def lagging_failover_run(
    tmp_path: Path, apache_kafka: Distribution, *overrides: str
) -> tuple[dict[str, Any], Path]:
    """A 60 s run with the lagging-failover fault only; its report (exit 0: no anomaly, 1:
    anomalies) and its work directory."""
    work_dir = tmp_path / "run"
    report_path = tmp_path / "report.json"
    command = [
        *verify_command(),
        *("--apache-kafka", str(apache_kafka.libs), "--nodes", "3"),
        *("--duration", "60s", "--faults", LAGGING_FAILOVER, "--seed", "1"),
        *("--transaction-timeout-ms", "5000", *QUICK_ISR, *overrides),
        *("--work-dir", str(work_dir), "--json", str(report_path)),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    assert done.returncode in (0, 1), f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report = json.loads(report_path.read_text())
    assert not report["errors"], report["errors"]
    assert report["faults_injected"].get(LAGGING_FAILOVER, 0) >= 1, report
    return report, work_dir


def unclean_elections(work_dir: Path) -> int:
    return sum(
        log.read_text(errors="replace").count(UNCLEAN_ELECTION)
        for log in (work_dir / "kafka").glob("node-*/logs/server.log")
    )


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_unsafe_settings_lose_acknowledged_writes_under_lagging_failover(
    tmp_path: Path, apache_kafka: Distribution
) -> None:
    report, work_dir = lagging_failover_run(tmp_path, apache_kafka, *UNSAFE)
    failovers = report["details"]["lagging_failovers"]
    bitten = [f for f in failovers if f.get("acknowledged_alone") and f["new_leader"] >= 0]
    assert bitten, failovers  # a lone leader acknowledged writes, then another was elected
    assert unclean_elections(work_dir) >= 1
    assert report["anomalies"]["lost-write"] >= 1, report["anomalies"]
    assert not report["valid"]


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_safe_settings_lose_nothing_under_lagging_failover(
    tmp_path: Path, apache_kafka: Distribution
) -> None:
    report, work_dir = lagging_failover_run(tmp_path, apache_kafka)
    assert report["valid"] and report["ok"], report["anomalies"]
    assert set(report["anomalies"].values()) == {0}
    failovers = report["details"]["lagging_failovers"]
    stranded = [f for f in failovers if "alone_after_s" in f]
    assert stranded, failovers  # the leader was alone in its ISR...
    # ...and acknowledged nothing alone (NOT_ENOUGH_REPLICAS): nothing for an election to lose
    assert all(f.get("acknowledged_alone") in (0, None) for f in stranded), stranded
    assert unclean_elections(work_dir) == 0
    assert report["operations"]["committed"] >= 10, report["operations"]
