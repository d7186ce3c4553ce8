"""The Java consumer 4.4's rolling upgrade on onceflow: two kafka-verifiable-consumers in a
classic group (--group-protocol classic, Kafka 4's default strategies: range, then
cooperative-sticky) are replaced one at a time by --group-protocol consumer ones while they
consume. The first replacement upgrades the classic group with a member in it (Kafka 4's
group.consumer.migration.policy=bidirectional); the classic member goes on inside the
consumer group until it is replaced. Every record is read, and the group ends a consumer group.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from onceflow.apache_kafka import Distribution
from onceflow.broker.embedded import EmbeddedBroker
from onceflow.verify.final_reads import group_type
from tests.apache_kafka.test_consumer_group_protocol import (
    PARTITIONS,
    TIMEOUT_S,
    VerifiableConsumer,
)
from tests.confluent import create_topic, produce
from tests.waiting import wait_for


def test_java_consumers_upgrade_a_classic_group_one_at_a_time(
    apache_kafka: Distribution, kip848_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = kip848_broker.bootstrap
    topic, group = f"jup-{uuid.uuid4().hex[:8]}", f"jup-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    produced = 100
    produce(bootstrap, topic, [str(i).encode() for i in range(produced)])

    def start(protocol: str) -> VerifiableConsumer:
        consumer = VerifiableConsumer(
            apache_kafka, bootstrap, topic, group, tmp_path, group_protocol=protocol
        )
        consumers.append(consumer)
        return consumer

    def shared(a: VerifiableConsumer, b: VerifiableConsumer) -> bool:
        x, y = a.owned(), b.owned()
        return bool(x) and bool(y) and not x & y and x | y == set(range(PARTITIONS))

    consumers: list[VerifiableConsumer] = []
    try:
        a, b = start("classic"), start("classic")
        wait_for(lambda: shared(a, b), TIMEOUT_S, lambda: (a.owned(), b.owned()))
        assert group_type(bootstrap, group) == "classic"
        a.stop()
        a2 = start("consumer")
        wait_for(lambda: shared(a2, b), TIMEOUT_S, lambda: (a2.owned(), b.owned()))
        assert group_type(bootstrap, group) == "consumer"  # b is a classic member in it
        produce(bootstrap, topic, [str(i).encode() for i in range(produced, 2 * produced)])
        produced *= 2
        b.stop()
        b2 = start("consumer")
        wait_for(lambda: shared(a2, b2), TIMEOUT_S, lambda: (a2.owned(), b2.owned()))
        produce(bootstrap, topic, [str(i).encode() for i in range(produced, produced + 100)])
        produced += 100
        wait_for(
            lambda: sum(c.consumed() for c in consumers) >= produced,
            TIMEOUT_S,
            lambda: [c.consumed() for c in consumers],
        )
        assert group_type(bootstrap, group) == "consumer"
        assert a2.failed_commits() == [] and b2.failed_commits() == []
    finally:
        for consumer in consumers:
            consumer.stop()
