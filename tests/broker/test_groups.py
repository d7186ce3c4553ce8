"""Consumer groups with confluent-kafka: rebalances, commits, a member that dies."""

from __future__ import annotations

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.child_consumer import assigned_child
from tests.confluent import create_topic
from tests.waiting import wait_for


def consumer(bootstrap: str, group: str, **conf: object) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            **conf,
        }
    )


def test_rebalance_when_a_consumer_joins_and_leaves(bootstrap: str, topic_name: str) -> None:
    create_topic(bootstrap, topic_name, partitions=4)
    group = f"g-{topic_name}"
    a = consumer(bootstrap, group)
    a.subscribe([topic_name])
    wait_for(lambda: len(a.assignment()) == 4, 30, poll=lambda: a.poll(0.1))
    b = consumer(bootstrap, group)
    b.subscribe([topic_name])

    def both_assigned() -> bool:
        sa = {tp.partition for tp in a.assignment()}
        sb = {tp.partition for tp in b.assignment()}
        return bool(sa) and bool(sb) and sa | sb == {0, 1, 2, 3} and not sa & sb

    wait_for(both_assigned, 30, poll=lambda: (a.poll(0.05), b.poll(0.05)))
    b.close()  # LeaveGroup: a takes everything back
    wait_for(lambda: len(a.assignment()) == 4, 30, poll=lambda: a.poll(0.1))
    a.close()


CHILD_CONSUMER = """
import sys
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
              "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
c.subscribe([sys.argv[3]])
while True:
    c.poll(0.1)
    if c.assignment():
        print("assigned", flush=True)
"""


def test_a_killed_member_is_evicted_after_its_session_timeout(
    bootstrap: str, topic_name: str
) -> None:
    create_topic(bootstrap, topic_name, partitions=2)
    group = f"g-{topic_name}"
    with assigned_child(CHILD_CONSUMER, bootstrap, group, topic_name) as child:
        a = consumer(bootstrap, group)
        a.subscribe([topic_name])
        wait_for(lambda: len(a.assignment()) == 1, 30, poll=lambda: a.poll(0.1))
        child.kill()  # SIGKILL: no LeaveGroup, heartbeats just stop
        child.wait()
        wait_for(lambda: len(a.assignment()) == 2, 30, poll=lambda: a.poll(0.1))
        a.close()


def consume_values(c: Consumer, count: int) -> list[bytes]:
    """The values of the next `count` records the consumer is given."""
    values: list[bytes] = []
    wait_for(
        lambda: len(values) >= count,
        30,
        poll=lambda: values.extend(
            m.value() for m in c.consume(count - len(values), 0.2) if m.error() is None
        ),
    )
    return values


def test_committed_offsets_resume_a_restarted_consumer(bootstrap: str, topic_name: str) -> None:
    create_topic(bootstrap, topic_name, partitions=1)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(100):
        producer.produce(topic_name, value=str(i).encode())
    assert producer.flush(10) == 0
    group = f"g-{topic_name}"
    c = consumer(bootstrap, group)
    c.subscribe([topic_name])
    seen = consume_values(c, 40)
    c.commit(asynchronous=False)
    committed = c.committed([TopicPartition(topic_name, 0)], timeout=10)
    assert committed[0].offset == 40
    c.close()
    d = consumer(bootstrap, group)
    d.subscribe([topic_name])
    rest = consume_values(d, 60)
    assert seen + rest == [str(i).encode() for i in range(100)]
    d.close()
