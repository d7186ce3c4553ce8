"""kafka-python consumers as the clients tests make them."""

from __future__ import annotations

from typing import Any

from kafka import KafkaConsumer


def consumer(bootstrap: str, **conf: Any) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=200,
        **conf,
    )


def subscribe(c: KafkaConsumer, topic: str) -> None:
    """Subscribe once the topic's metadata is known. kafka-python 3.0 otherwise races: a first
    join without the metadata assigns nothing, and the rejoin's assignment is never applied (seen
    with group.initial.rebalance.delay.ms=0; Kafka's default 3 s delay hides it)."""
    assert c.partitions_for_topic(topic)
    c.subscribe([topic])
