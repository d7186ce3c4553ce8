"""After a kill -9 restart of the broker, Kafka's kafka-consumer-groups and `onceflow groups
describe` agree on the classic group the broker loaded (issue 24): Stable, the same three
members, each owning the partitions its consumer was assigned before the restart."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from onceflow.apache_kafka import Distribution
from onceflow.broker.embedded import EmbeddedBroker
from tests.apache_kafka.kafka_tools import CONSUMER_GROUPS, KafkaTools, space_table, write_log4j2
from tests.broker.group_consumers import DEADLINE_S, consuming, settled
from tests.cli.harness import invoke
from tests.waiting import wait_for


def test_kafka_consumer_groups_and_onceflow_agree_after_restart(
    apache_kafka: Distribution,
    make_broker: Callable[..., EmbeddedBroker],
    topic_name: str,
    tmp_path: Path,
) -> None:
    broker = make_broker()
    with consuming(broker, topic_name) as group:
        group.produce(30)
        wait_for(lambda: settled(group), DEADLINE_S, lambda: f"settled: {group.rebalances()}")
        group.wait_consumed_all()
        rebalances = group.rebalances()
        owners = {
            str(p): f"c{i}" for i, m in enumerate(group.members) for p in m.seen()[1]
        }  # partition -> client id, as the consumers were told
        broker.restart()

        tools = KafkaTools(apache_kafka, broker.bootstrap, write_log4j2(tmp_path))
        b = ("--bootstrap-server", broker.bootstrap, "--group", group.group_id)
        kafka_rows = space_table(tools.ok(CONSUMER_GROUPS, *b, "--describe").stdout, "GROUP")
        kafka = {r["PARTITION"]: (r["CONSUMER-ID"], r["CLIENT-ID"]) for r in kafka_rows}
        (state,) = space_table(
            tools.ok(CONSUMER_GROUPS, *b, "--describe", "--state").stdout, "GROUP"
        )
        described = invoke("groups", "describe", group.group_id, "-b", broker.bootstrap)
        assert described.exit_code == 0, described.stderr
        ours = {row[2]: (row[6], row[8]) for row in described.table_rows(first_cell=group.group_id)}
        assert group.rebalances() == rebalances  # nobody rebalanced meanwhile

    assert (state["STATE"], state["#MEMBERS"], state["ASSIGNMENT-STRATEGY"]) == (
        "Stable", "3", "range",
    )  # fmt: skip
    assert kafka == ours
    assert {p: client for p, (_, client) in kafka.items()} == owners
    assert len({member for member, _ in kafka.values()}) == 3
