"""A broker restart keeps its classic groups (issue 24): three confluent-kafka consumers keep
their generation and partitions across kill -9 restarts of the broker, with no rebalance
(neither on_revoke nor on_assign fires) when they come back within their session timeout;
consumers whose sessions ran out while the broker was down rebalance as usual."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from onceflow.broker.embedded import EmbeddedBroker
from tests.broker.group_consumers import DEADLINE_S, Group, consuming, settled
from tests.waiting import wait_for


@pytest.fixture
def consuming_group(
    make_broker: Callable[..., EmbeddedBroker], topic_name: str, request: pytest.FixtureRequest
) -> Iterator[Group]:
    """The consumers, with the session timeout the test's parameter gives (ms)."""
    with consuming(make_broker(), topic_name, getattr(request, "param", 30_000)) as group:
        yield group


def test_restarts_keep_generation_and_assignments_without_rebalance(consuming_group: Group) -> None:
    group = consuming_group
    group.produce(60)
    wait_for(lambda: settled(group), DEADLINE_S, lambda: f"a settled group: {group.rebalances()}")
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
    wait_for(lambda: settled(group), DEADLINE_S, lambda: f"a settled group: {group.rebalances()}")
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
    wait_for(lambda: settled(group), DEADLINE_S, lambda: f"a new generation: {group.rebalances()}")
    _, now = group.describe()
    assert set(now).isdisjoint(described)  # they rejoined as new members
    assert group.generation(next(iter(now))) > generation
    group.produce(30)
    group.wait_consumed_all()
