"""The lagging-failover fault's steps, on a scripted cluster (no JVM): isolate the leader, wait
until it is alone in its ISR, then kill it, heal its links, wait for another leader or a
deadline, restart it; and which targets it applies to."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from onceflow.protocol.client import KafkaClientError
from onceflow.verify.faults import (
    FAULT_KINDS,
    LAGGING_FAILOVER,
    FaultError,
    Nemesis,
    Targets,
    parse_faults,
)
from onceflow.verify.harness import VerifyOptions, usable_faults
from onceflow.verify.history import FAIL, NEMESIS, OK, History
from onceflow.verify.lagging_failover import LaggingFailover

TOPIC = "verify-t-a"


class ScriptedCluster:
    """A 3-node cluster as the fault sees it: leader 1 with followers 2 and 3, which leave
    the ISR `shrinks_after` polls after the leader is isolated (never if None) and one of
    which is elected `elects_after` polls after the kill (never if None)."""

    def __init__(
        self, shrinks_after: int | None = 2, elects_after: int | None = 3, acks: bool = True
    ) -> None:
        self.shrinks_after, self.elects_after = shrinks_after, elects_after
        self.acks = acks  # the lone leader acknowledges writes (min.insync.replicas=1)
        self.calls: list[str] = []
        self.isolated: set[int] = set()
        self.killed: set[int] = set()
        self.isr_polls = self.leader_polls = 0
        self.watermark = 100
        self.flaky = False  # the next look-up fails, as one against a node just cut does

    def leader(self, topic: str, partition: int) -> int:
        if self.flaky:
            self.flaky = False
            raise KafkaClientError("connection reset")
        if 1 not in self.killed:
            return 1
        self.leader_polls += 1
        if self.elects_after is not None and self.leader_polls > self.elects_after:
            return 2
        return -1

    def isr(self, topic: str, partition: int) -> list[int]:
        self.isr_polls += 1
        stranded = 1 in self.isolated and self.shrinks_after is not None
        return [1] if stranded and self.isr_polls > self.shrinks_after else [1, 2, 3]

    def high_watermark(self, topic: str, partition: int) -> int:
        self.watermark += 10 if self.acks else 0  # the workload writes on
        return self.watermark

    def isolate(self, node: int) -> None:
        self.calls.append(f"isolate {node}")
        self.isolated.add(node)

    def reconnect(self, node: int) -> None:
        self.calls.append(f"reconnect {node}")
        self.isolated.discard(node)

    def kill(self, node: int) -> None:
        self.calls.append(f"kill {node}")
        self.killed.add(node)

    def restart(self, node: int) -> None:
        self.calls.append(f"restart {node}")
        self.killed.discard(node)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def failover(cluster: ScriptedCluster, clock: Clock) -> LaggingFailover:
    return LaggingFailover(
        cluster,
        TOPIC,
        1,
        isr_timeout_s=10,
        leader_timeout_s=5,
        clock=clock,
        sleep=clock.sleep,
    )


def test_the_leader_is_stranded_alone_in_its_isr_then_killed_and_a_follower_elected() -> None:
    cluster, clock = ScriptedCluster(), Clock()
    fault = failover(cluster, clock)
    stranded = fault.strand()
    assert cluster.calls == ["isolate 1"] and 1 in cluster.isolated  # still cut while held
    assert stranded["leader"] == 1 and stranded["high_watermark_alone"] == 110
    assert stranded["alone_after_s"] == pytest.approx(0.4)

    healed = fault.fail_over()
    # killed before its links heal: it never replicates what it acknowledged alone
    assert cluster.calls == ["isolate 1", "kill 1", "reconnect 1", "restart 1"]
    assert healed["new_leader"] == 2
    assert healed["high_watermark_at_kill"] == 130 and healed["acknowledged_alone"] == 20
    assert healed["high_watermark_new_leader"] == 140 and healed["new_leader_behind"] == 0
    assert fault.steps == ["isolate 1", "alone", "kill 1", "reconnect 1", "elected 2", "restart 1"]
    assert fault.outcome["new_leader"] == 2 and fault.outcome["leader"] == 1


def test_with_no_other_leader_the_old_one_is_restarted_at_the_deadline() -> None:
    """The safe settings: the lone leader acknowledges nothing (waited for up to
    ack_timeout_s), no unclean election, the partition offline until it returns."""
    cluster, clock = ScriptedCluster(elects_after=None, acks=False), Clock()
    fault = failover(cluster, clock)
    fault.strand()
    alone_at = clock.now
    healed = fault.fail_over()
    assert healed["new_leader"] == -1 and "new_leader_after_s" not in healed
    assert healed["acknowledged_alone"] == 0
    assert clock.now - alone_at >= 10 + 5  # the whole ack_timeout_s and leader_timeout_s
    assert cluster.calls[-1] == "restart 1" and not cluster.killed


def test_an_isr_that_does_not_shrink_fails_the_fault_and_heals_the_links() -> None:
    cluster, clock = ScriptedCluster(shrinks_after=None), Clock()
    fault = failover(cluster, clock)
    with pytest.raises(FaultError, match="did not shrink to its leader 1 alone"):
        fault.strand()
    assert cluster.calls == ["isolate 1", "reconnect 1"] and not cluster.isolated
    assert clock.now >= 10


def test_the_end_of_the_run_cuts_the_waits_short_but_not_the_failover() -> None:
    cluster, clock = ScriptedCluster(shrinks_after=None), Clock()
    fault = failover(cluster, clock)
    fault.interrupted = lambda: True
    with pytest.raises(FaultError, match="the run ended"):
        fault.strand()
    assert clock.now < 1 and cluster.calls == ["isolate 1", "reconnect 1"]

    cluster, clock = ScriptedCluster(acks=False), Clock()
    fault = failover(cluster, clock)
    fault.strand()
    fault.interrupted = lambda: True
    assert fault.fail_over()["new_leader"] == 2  # no wait for a write; killed and restarted
    assert clock.now < 2 and cluster.calls[-1] == "restart 1"


def test_a_failed_look_up_is_not_yet_and_no_leader_is_no_fault() -> None:
    cluster, clock = ScriptedCluster(), Clock()
    cluster.flaky = True
    fault = failover(cluster, clock)
    with pytest.raises(FaultError, match="no leader"):  # the first look-up failed
        fault.strand()
    assert cluster.calls == []  # nothing was done
    assert failover(cluster, clock).strand()["leader"] == 1


def test_the_nemesis_holds_the_stranded_leader_then_fails_it_over(tmp_path: Path) -> None:
    cluster, clock = ScriptedCluster(), Clock()

    class Nodes:
        def lagging_failover(self, rng: random.Random) -> LaggingFailover:
            return failover(cluster, clock)

    history = History(tmp_path / "history.jsonl")
    nemesis = Nemesis(
        (LAGGING_FAILOVER,),
        Targets(None, None, None, None, nodes=Nodes()),  # type: ignore[arg-type]
        history,
        random.Random(3),
        scale=0.01,
    )
    nemesis._one(LAGGING_FAILOVER)
    assert nemesis.injected[LAGGING_FAILOVER] == 1
    events = [op for op in history.ops if op.process == NEMESIS]
    assert [op.type for op in events] == ["invoke", OK]
    done = events[-1].value
    assert done["target"] == f"leader of {TOPIC}-1" and done["of"] == f"{TOPIC}-1"
    assert done["leader"] == 1 and done["new_leader"] == 2 and done["acknowledged_alone"] == 20

    stuck = ScriptedCluster(shrinks_after=None)

    class StuckNodes:
        def lagging_failover(self, rng: random.Random) -> LaggingFailover:
            return failover(stuck, Clock())

    nemesis.targets = Targets(None, None, None, None, nodes=StuckNodes())  # type: ignore[arg-type]
    nemesis._one(LAGGING_FAILOVER)  # could not strand: recorded as failed, not counted
    assert history.ops[-1].type == FAIL and "did not shrink" in history.ops[-1].value["error"]
    assert nemesis.injected[LAGGING_FAILOVER] == 1 and stuck.calls[-1] == "reconnect 1"
    history.close()


def test_all_has_lagging_failover_on_apache_kafka_only() -> None:
    assert LAGGING_FAILOVER in parse_faults("all", apache_kafka=True)
    assert parse_faults("all") == FAULT_KINDS  # the embedded runs' `all` is unchanged
    assert parse_faults("kill,lagging-failover") == ("kill", LAGGING_FAILOVER)

    def unavailable(**options: object) -> dict[str, str]:
        kinds = (LAGGING_FAILOVER, "kill")
        usable, why = usable_faults(VerifyOptions(faults=kinds, **options))  # type: ignore[arg-type]
        assert set(usable) | set(why) == set(kinds)
        return why

    assert unavailable(apache_kafka="fetched") == {}
    assert "2 or more nodes" in unavailable(apache_kafka="fetched", nodes=1)[LAGGING_FAILOVER]
    assert "embedded" in unavailable()[LAGGING_FAILOVER]
    assert unavailable(bootstrap="127.0.0.1:9092")[LAGGING_FAILOVER] == "needs --apache-kafka"
