"""A broker restart keeps its classic groups (issue 24): three confluent-kafka consumers keep
their generation and partitions across kill -9 restarts of the broker, with no rebalance
(neither on_revoke nor on_assign fires) when they come back within their session timeout;
consumers whose sessions ran out while the broker was down rebalance as usual."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
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
            self.producer.produce(self.topic, f"v{self.produced + i}".encode(), partition=i % 6)
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


@pytest.fixture
def consuming_group(
    make_broker: Callable[..., EmbeddedBroker], topic_name: str, request: pytest.FixtureRequest
) -> Iterator[Group]:
    """CONSUMERS consumers of one group, each polling in a thread, on a topic of PARTITIONS
    partitions, with the session timeout the test's parameter gives (ms)."""
    session_ms = getattr(request, "param", 30_000)
    broker = make_broker()
    create_topic(broker.bootstrap, topic_name, partitions=PARTITIONS)
    group_id = f"g-{topic_name}"
    members = []
    for i in range(CONSUMERS):
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
        m.consumer.subscribe([topic_name], on_assign=m.on_assign, on_revoke=m.on_revoke)
    stop = threading.Event()
    threads = [threading.Thread(target=m.poll_until, args=(stop,), daemon=True) for m in members]
    for t in threads:
        t.start()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, **QUIET})
    group = Group(broker, topic_name, group_id, members, producer)
    try:
        yield group
    finally:
        stop.set()
        for t in threads:
            t.join(DEADLINE_S)
        for m in members:
            m.consumer.close()


def _settled(group: Group) -> bool:
    """Every consumer has its two partitions and the broker's group is Stable."""
    if sorted(len(a) for a in group.assignments()) != [2] * CONSUMERS:
        return False
    state, members = group.describe()
    return state == "Stable" and len(members) == CONSUMERS


def test_restarts_keep_generation_and_assignments_without_rebalance(consuming_group: Group) -> None:
    group = consuming_group
    group.produce(60)
    wait_for(lambda: _settled(group), DEADLINE_S, lambda: f"a settled group: {group.rebalances()}")
    group.wait_consumed_all()
    rebalances, assignments = group.rebalances(), group.assignments()
    state, described = group.describe()
    generation = group.generation(next(iter(described)))
    for restart in range(3):
        group.broker.restart()  # kill -9, then the same data directory and port
        assert group.describe() == (state, described), f"restart {restart}"
        assert group.generation(next(iter(described))) == generation
        group.produce(60)
        group.wait_consumed_all()  # each consumer goes on with its partitions
        assert group.rebalances() == rebalances, f"a rebalance after restart {restart}"
        assert group.assignments() == assignments
    assert group.describe() == (state, described)


@pytest.mark.parametrize("consuming_group", [6_000], indirect=True)
def test_sessions_that_ran_out_while_down_rebalance(consuming_group: Group) -> None:
    group = consuming_group
    group.produce(30)
    wait_for(lambda: _settled(group), DEADLINE_S, lambda: f"a settled group: {group.rebalances()}")
    group.wait_consumed_all()
    _, described = group.describe()
    generation = group.generation(next(iter(described)))
    group.broker.kill()
    # The consumers give up their partitions once their session runs out without the broker.
    wait_for(
        lambda: all(not a for a in group.assignments()),
        DEADLINE_S,
        lambda: f"every consumer's session to time out: {group.rebalances()}",
    )
    group.broker.start()
    wait_for(lambda: _settled(group), DEADLINE_S, lambda: f"a new generation: {group.rebalances()}")
    _, now = group.describe()
    assert set(now).isdisjoint(described)  # they rejoined as new members
    assert group.generation(next(iter(now))) > generation
    group.produce(30)
    group.wait_consumed_all()
