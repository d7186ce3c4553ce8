"""Apache Kafka as a benchmark target: one KRaft node started by onceflow.apache_kafka's helper
on loopback, in the benchmark's work directory, stopped (SIGKILL) at the end.

Two durability settings, each a target of its own: like for like with onceflow's broker
(which fsyncs before it acknowledges), `log.flush.interval.messages=1` (the broker default of
the topic config `flush.messages`: every append is fsynced before the produce is answered),
and Kafka's defaults (no fsync per write; the OS writes back when it likes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from onceflow.apache_kafka import Distribution, KafkaCluster, KafkaClusterError, MissingTool, locate
from onceflow.bench.errors import BenchError
from onceflow.bench.targets import (
    BROKER_READY_TIMEOUT_S,
    Broker,
    Launcher,
    TargetSpec,
    rss_bytes,
)
from onceflow.tools.errors import UsageError

# A benchmark wants peak throughput: C2 (the helper's default is C1 only, for quick starts)
# and a heap fit for a broker under load, still small beside the machine's 24 GiB.
KAFKA_HEAP = "1g"
KAFKA_JVM_OPTIONS: tuple[str, ...] = ()
# A JVM with C2 on a loaded 2-core machine takes a while to start and elect itself.
KAFKA_START_TIMEOUT_S = 240.0
FSYNC_SETTINGS = {"log.flush.interval.messages": "1"}
# --apache-kafka-durability: which of the two Kafka targets a run starts.
DURABILITIES = ("both", "fsync", "defaults")
# The value of --apache-kafka that means "the fetched jars" (or $ONCEFLOW_APACHE_KAFKA).
FETCHED = "fetched"


class KafkaNodeBroker:
    """A one-node KafkaCluster seen as a started broker (targets.Broker)."""

    def __init__(self, name: str, cluster: KafkaCluster) -> None:
        self.name = name
        self.cluster = cluster

    @property
    def pid(self) -> int:
        return self.cluster.pids()[1]

    def wait_ready(self, timeout_s: float = BROKER_READY_TIMEOUT_S) -> None:
        # The cluster's own (longer) deadline: a JVM with C2 starts slowly on a busy machine.
        try:
            self.cluster.start()
        except (KafkaClusterError, OSError) as exc:
            raise BenchError(f"Apache Kafka '{self.name}' did not start: {exc}") from exc

    def rss(self) -> int | None:
        return rss_bytes(self.pid)

    def stop(self, grace_s: float = 10.0) -> None:
        self.cluster.stop()


def kafka_launcher(distribution: Distribution, settings: dict[str, str]) -> Launcher:
    def launch(name: str, workdir: Path) -> tuple[Broker, str]:
        cluster = KafkaCluster(
            workdir / "kafka",
            nodes=1,
            distribution=distribution,
            heap=KAFKA_HEAP,
            jvm_options=KAFKA_JVM_OPTIONS,
            settings=settings,
            start_timeout_s=KAFKA_START_TIMEOUT_S,
        )
        return KafkaNodeBroker(name, cluster), cluster.bootstrap_servers

    return launch


def kafka_distribution(where: str) -> Distribution:
    """The jars --apache-kafka names: a distribution or libs/ folder, or "fetched"."""
    try:
        return locate(None if where == FETCHED else where)
    except (MissingTool, ValueError, RuntimeError) as exc:
        raise UsageError(f"--apache-kafka: {exc}") from exc


def kafka_targets(where: str | None, durability: str) -> Sequence[TargetSpec]:
    """Apache Kafka with fsync per write and/or with its defaults (none without `where`)."""
    if where is None:
        return []
    if durability not in DURABILITIES:
        raise UsageError(
            f"--apache-kafka-durability must be one of {', '.join(DURABILITIES)}, "
            f"not '{durability}'."
        )
    distribution = kafka_distribution(where)
    specs = []
    if durability in ("both", "fsync"):
        specs.append(
            TargetSpec("kafka (fsync)", launch=kafka_launcher(distribution, FSYNC_SETTINGS))
        )
    if durability in ("both", "defaults"):
        specs.append(TargetSpec("kafka (no fsync)", launch=kafka_launcher(distribution, {})))
    return specs
