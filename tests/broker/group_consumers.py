"""Consumers of one classic group, each polling in its own thread, and what the broker says of
their group: for the tests of group state across broker restarts (issue 24)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from confluent_kafka import Consumer, Producer
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.errors import ErrorCode
from kio.schema.heartbeat.v4.request import HeartbeatRequest
from kio.schema.types import GroupId
from kio.static.primitive import i32

from onceflow.broker.embedded import EmbeddedBroker
from tests.admin_requests import call
from tests.confluent import QUIET, create_topic
from tests.waiting import wait_for

PARTITIONS = 6
CONSUMERS = 3
DEADLINE_S = 90.0


@dataclass
class Member:
    """One consumer polling in its own thread; what its callbacks and polls saw."""

    consumer: Consumer
    rebalances: list[str] = field(default_factory=list)  # "assign [..]" / "revoke [..]"
    assigned: frozenset[int] = frozenset()
    values: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_assign(self, consumer: Consumer, partitions: list) -> None:
        with self.lock:
            self.rebalances.append(f"assign {sorted(p.partition for p in partitions)}")
            self.assigned = frozenset(p.partition for p in partitions)

    def on_revoke(self, consumer: Consumer, partitions: list) -> None:
        with self.lock:
            self.rebalances.append(f"revoke {sorted(p.partition for p in partitions)}")
            self.assigned = frozenset()

    def poll_until(self, stop: threading.Event) -> None:
        while not stop.is_set():
            message = self.consumer.poll(0.2)
            if message is not None and message.error() is None:
                with self.lock:
                    self.values.append(message.value())

    def seen(self) -> tuple[list[str], frozenset[int], list[bytes]]:
        with self.lock:
            return list(self.rebalances), self.assigned, list(self.values)


@dataclass
class Group:
    broker: EmbeddedBroker
    topic: str
    group_id: str
    members: list[Member]
    producer: Producer
    produced: int = 0

    def produce(self, n: int) -> None:
        for i in range(n):
            self.producer.produce(
                self.topic, f"v{self.produced + i}".encode(), partition=i % PARTITIONS
            )
        self.produced += n
        assert self.producer.flush(DEADLINE_S) == 0

    def consumed(self) -> set[bytes]:
        return {v for m in self.members for v in m.seen()[2]}

    def wait_consumed_all(self) -> None:
        want = {f"v{i}".encode() for i in range(self.produced)}
        wait_for(
            lambda: self.consumed() >= want,
            DEADLINE_S,
            lambda: f"all {len(want)} values consumed, got {len(self.consumed() & want)}",
        )

    def rebalances(self) -> list[list[str]]:
        return [m.seen()[0] for m in self.members]

    def assignments(self) -> list[frozenset[int]]:
        return [m.seen()[1] for m in self.members]

    def describe(self) -> tuple[str, dict[str, bytes]]:
        """(state, member id -> assignment bytes) as DescribeGroups answers."""
        request = DescribeGroupsRequest(
            groups=(GroupId(self.group_id),), include_authorized_operations=False
        )
        [group] = call(self.broker.bootstrap, request).groups
        return group.group_state, {m.member_id: m.member_assignment for m in group.members}

    def generation(self, member_id: str) -> int:
        """The generation the broker holds for the group: the one a member's Heartbeat is
        accepted at (any other is ILLEGAL_GENERATION)."""
        for generation in range(1, 50):
            request = HeartbeatRequest(
                group_id=GroupId(self.group_id), generation_id=i32(generation), member_id=member_id
            )
            error = call(self.broker.bootstrap, request).error_code
            if error is ErrorCode.none:
                return generation
            assert error is ErrorCode.illegal_generation, error
        raise AssertionError("no generation accepted")


@contextmanager
def consuming(
    broker: EmbeddedBroker, topic: str, session_ms: int = 30_000, consumers: int = CONSUMERS
) -> Iterator[Group]:
    """`consumers` consumers of one group, each polling in a thread, on a new topic of
    PARTITIONS partitions; closed at the end."""
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    group_id = f"g-{topic}"
    members = []
    for i in range(consumers):
        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": group_id,
                "client.id": f"c{i}",
                "session.timeout.ms": session_ms,
                "heartbeat.interval.ms": 500,
                "partition.assignment.strategy": "range",
                "auto.offset.reset": "earliest",
                "auto.commit.interval.ms": 200,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500,
                **QUIET,
            }
        )
        members.append(Member(consumer))
    for m in members:
        m.consumer.subscribe([topic], on_assign=m.on_assign, on_revoke=m.on_revoke)
    stop = threading.Event()
    threads = [threading.Thread(target=m.poll_until, args=(stop,), daemon=True) for m in members]
    for t in threads:
        t.start()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, **QUIET})
    try:
        yield Group(broker, topic, group_id, members, producer)
    finally:
        stop.set()
        for t in threads:
            t.join(DEADLINE_S)
        for m in members:
            m.consumer.close()


def settled(group: Group) -> bool:
    """Every consumer has its two partitions and the broker's group is Stable."""
    if sorted(len(a) for a in group.assignments()) != [2] * CONSUMERS:
        return False
    state, members = group.describe()
    return state == "Stable" and len(members) == CONSUMERS
