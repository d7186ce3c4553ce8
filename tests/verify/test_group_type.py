"""The probe behind a verify run's `copy_group_type` (a run that asked for one protocol and
ran the other is an error): it tells a classic group from a consumer group as the broker lists
them, and an unknown group from both."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer

from onceflow.verify.final_reads import group_type
from tests.confluent import QUIET, create_topic, produce
from tests.waiting import wait_for


def test_group_type_tells_the_protocols_apart(bootstrap: str) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, [b"v"] * 4)
    groups = {
        protocol: f"g-{protocol}-{uuid.uuid4().hex[:8]}" for protocol in ("classic", "consumer")
    }
    consumers = [
        Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "group.protocol": protocol,
                "auto.offset.reset": "earliest",
                **QUIET,
            }
        )
        for protocol, group in groups.items()
    ]
    try:
        for c in consumers:
            c.subscribe([topic])
        wait_for(
            lambda: all(c.poll(0.2) is not None or c.assignment() for c in consumers),
            timeout=60,
            what="both consumers joined their groups",
        )
        for protocol, group in groups.items():
            assert group_type(bootstrap, group) == protocol
    finally:
        for c in consumers:
            c.close()
    assert group_type(bootstrap, f"g-none-{uuid.uuid4().hex[:8]}") is None
