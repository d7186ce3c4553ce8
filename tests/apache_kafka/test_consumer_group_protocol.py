"""The Java consumer 4.x with group.protocol=consumer (KIP-848) on onceflow: Kafka's
kafka-verifiable-consumer, two of them in one group; the second joining takes half the
partitions from the first without the first giving up any partition it keeps, both commit,
and when the second leaves the first takes everything back. And two transactional Java
copiers (Kip848Copier.java) in such a group: every input copied exactly once."""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

from onceflow.apache_kafka import Distribution
from onceflow.broker.embedded import EmbeddedBroker
from tests.apache_kafka.kafka_tools import VERIFIABLE_CONSUMER, write_log4j2
from tests.confluent import create_topic, produce
from tests.eos.checker import read_back
from tests.waiting import wait_for

PARTITIONS = 4
TIMEOUT_S = 120.0  # JVMs start slowly on a shared 2-core machine


class VerifiableConsumer:
    """kafka-verifiable-consumer as a child process, its JSON events collected as they come."""

    def __init__(
        self,
        distribution: Distribution,
        bootstrap: str,
        topic: str,
        group: str,
        tmp: Path,
        *extra: str,
        group_protocol: str = "consumer",
    ) -> None:
        command = distribution.command(
            VERIFIABLE_CONSUMER,
            "--bootstrap-server", bootstrap, "--topic", topic, "--group-id", group,
            "--reset-policy", "earliest", "--group-protocol", group_protocol, *extra,
            options=(f"-Dlog4j2.configurationFile={write_log4j2(tmp)}",),
        )  # fmt: skip
        self.events: list[dict[str, Any]] = []
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def owned(self) -> set[int]:
        """The partitions it owns now, from its assigned/revoked events (incremental)."""
        owned: set[int] = set()
        for event in list(self.events):
            parts = {p["partition"] for p in event.get("partitions", ())}
            if event["name"] == "partitions_assigned":
                owned |= parts
            elif event["name"] in ("partitions_revoked", "partitions_lost"):
                owned -= parts
        return owned

    def revoked(self) -> set[int]:
        return {
            p["partition"]
            for e in list(self.events)
            if e["name"] == "partitions_revoked"
            for p in e["partitions"]
        }

    def consumed(self) -> int:
        return sum(e["count"] for e in list(self.events) if e["name"] == "records_consumed")

    def failed_commits(self) -> list[dict[str, Any]]:
        return [
            e for e in list(self.events) if e["name"] == "offsets_committed" and not e["success"]
        ]

    def stop(self) -> None:
        """SIGTERM: the consumer closes (leaves the group) and prints shutdown_complete."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(10)


def test_java_consumers_share_and_hand_back_partitions(
    apache_kafka: Distribution, kip848_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = kip848_broker.bootstrap
    topic, group = f"java848-{uuid.uuid4().hex[:8]}", f"java848-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    produce(bootstrap, topic, [str(i).encode() for i in range(100)])
    first = VerifiableConsumer(apache_kafka, bootstrap, topic, group, tmp_path)
    consumers = [first]
    try:
        wait_for(lambda: first.owned() == set(range(PARTITIONS)), TIMEOUT_S, first.owned)
        wait_for(lambda: first.consumed() >= 100, TIMEOUT_S, first.consumed)
        second = VerifiableConsumer(apache_kafka, bootstrap, topic, group, tmp_path)
        consumers.append(second)

        def shared() -> bool:
            a, b = first.owned(), second.owned()
            return len(a) == len(b) == PARTITIONS // 2 and not a & b

        wait_for(shared, TIMEOUT_S, lambda: (first.owned(), second.owned()))
        # Incremental: the first gave up only what the second took.
        assert first.revoked() == second.owned(), json.dumps(
            [e for e in first.events if e["name"] != "records_consumed"]
        )
        produce(bootstrap, topic, [str(i).encode() for i in range(100, 200)])
        wait_for(lambda: first.consumed() + second.consumed() >= 200, TIMEOUT_S, "200 consumed")
        assert second.consumed() > 0
        second.stop()
        wait_for(lambda: first.owned() == set(range(PARTITIONS)), TIMEOUT_S, first.owned)
        assert first.failed_commits() == [] and second.failed_commits() == []
        assert any(e["name"] == "offsets_committed" for e in second.events)
    finally:
        for consumer in consumers:
            consumer.stop()


JAVA = Path(__file__).parent / "java"


class JavaCopier:
    """Kip848Copier.java (source-file mode) as a child process, its lines collected."""

    def __init__(self, distribution: Distribution, *args: str) -> None:
        command = distribution.command(str(JAVA / "Kip848Copier.java"), *args)
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())

    def assigned(self) -> set[int]:
        return {int(line.split()[1]) for line in list(self.lines) if line.startswith("assigned ")}

    def copied(self) -> int:
        counts = [int(line.split()[1]) for line in list(self.lines) if line.startswith("copied ")]
        return counts[-1] if counts else 0

    def wait(self) -> int:
        try:
            return self.process.wait(TIMEOUT_S)
        finally:
            self._reader.join(10)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def test_java_transactional_copiers_in_a_consumer_protocol_group(
    apache_kafka: Distribution, kip848_broker: EmbeddedBroker
) -> None:
    """Two Java copiers (sendOffsetsToTransaction with the consumer's group metadata), the
    second joining while the first copies: the output holds every input exactly once."""
    bootstrap = kip848_broker.bootstrap
    tag = uuid.uuid4().hex[:8]
    source, sink, group = f"jin-{tag}", f"jout-{tag}", f"jcopy-{tag}"
    create_topic(bootstrap, source, 4)
    create_topic(bootstrap, sink, 1)
    total = 400
    produce(bootstrap, source, [str(i).encode() for i in range(total)])
    copiers: list[JavaCopier] = []
    try:
        args = (bootstrap, group, source, sink)
        copiers.append(JavaCopier(apache_kafka, *args, f"jcopier-{tag}-0", "8000"))
        wait_for(lambda: copiers[0].copied() > 0, TIMEOUT_S, lambda: copiers[0].lines[-5:])
        produce(bootstrap, source, [str(i).encode() for i in range(total, 2 * total)])
        copiers.append(JavaCopier(apache_kafka, *args, f"jcopier-{tag}-1", "8000"))
        for copier in copiers:
            assert copier.wait() == 0, copier.lines[-20:]
        assert copiers[1].assigned(), copiers[1].lines[-20:]  # it took part
    finally:
        for copier in copiers:
            copier.kill()
    [read] = read_back(bootstrap, [(sink, 0)]).values()
    assert sorted(int(v) for v in read.committed) == list(range(2 * total))
