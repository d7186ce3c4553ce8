"""Background work that cannot die: group commit, session expiry, transaction timeouts, and
producer ids the broker never issued.

Each test makes the broker fail where it used to stop answering (a log deleted mid-flush, a
descriptor shortage while preparing a flush, an exception in a background loop), checks the
Kafka answer, then that the broker still serves and that the loop still does its work.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kio.schema.delete_topics.v4.request import DeleteTopicsRequest
from kio.schema.describe_groups.v1.request import DescribeGroupsRequest
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.join_group.v3.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from onceflow.broker.embedded import EmbeddedBroker
from tests.confluent import create_topic
from tests.waiting import wait_for, wait_for_line
from tests.wire import WAIT, WireClient, good_batch, produce_errors, produce_request

DEADLINE = 30.0  # seconds a background loop may take to show its work


def produce_to(topics: dict[str, bytes]) -> ProduceRequest:
    return ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=WAIT),
        topic_data=tuple(
            TopicProduceData(name=t, partition_data=(PartitionProduceData(index=0, records=r),))
            for t, r in topics.items()
        ),
    )


def codes(response: Any) -> dict[str, ErrorCode]:
    return {t.name: p.error_code for t in response.responses for p in t.partition_responses}


def read_all(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    try:
        tp = TopicPartition(topic, 0, 0)
        _, high = consumer.get_watermark_offsets(tp, timeout=WAIT)
        consumer.assign([tp])
        got: list[bytes] = []
        deadline = time.monotonic() + WAIT
        while True:
            position = consumer.position([tp])[0].offset
            if position >= high or time.monotonic() > deadline:
                break
            for msg in consumer.consume(100, timeout=0.5):
                if msg.error() is None:
                    got.append(msg.value())
        return got
    finally:
        consumer.close()


def produce_all(bootstrap: str, topic: str, values: list[bytes], **conf: Any) -> None:
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **conf})
    for value in values:
        producer.produce(
            topic, value=value, partition=0, on_delivery=lambda e, _m: e and errors.append(e)
        )
    assert producer.flush(WAIT) == 0
    assert errors == []


def alive(broker: EmbeddedBroker) -> None:
    assert broker.process is not None and broker.process.poll() is None


# -- finding 3: a group-commit flush never dies ----------------------------------------------------


def test_delete_topics_mid_flush_answers_the_waiters_and_spares_other_topics(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    # Every flush waits before preparing its log, so the DeleteTopics pipelined behind the
    # produce lands between the append and the flush's prepare_flush.
    broker = make_broker(env={"ONCEFLOW_DELAY_AT": "commit.before-round:300"})
    create_topic(broker.bootstrap, "doomed")
    create_topic(broker.bootstrap, "other")
    client = WireClient(broker.bootstrap)
    produce = produce_to({"doomed": good_batch(), "other": good_batch([b"kept"])})
    produced = client.send(produce)
    delete = DeleteTopicsRequest(topic_names=("doomed",), timeout=datetime.timedelta(seconds=5))
    deleted = client.send(delete)
    answer = client.receive(produce, produced)
    # As Kafka answers a produce waiting on a partition deleted meanwhile; the other topic's
    # write is durable and acknowledged.
    assert codes(answer) == {
        "doomed": ErrorCode.unknown_topic_or_partition,
        "other": ErrorCode.none,
    }
    assert client.receive(delete, deleted).responses[0].error_code == ErrorCode.none
    # The connection goes on; so does the broker, for another client.
    assert codes(client.call(produce_to({"other": good_batch([b"next"])}))) == {
        "other": ErrorCode.none
    }
    client.close()
    produce_all(broker.bootstrap, "other", [b"from-another-client"])
    assert read_all(broker.bootstrap, "other") == [b"kept", b"next", b"from-another-client"]
    alive(broker)


def test_emfile_while_preparing_a_flush_fails_that_write_retriably_and_the_broker_goes_on(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    # The first log prepared for a flush fails as os.dup does when out of descriptors.
    broker = make_broker(env={"ONCEFLOW_RAISE_AT": "commit.prepare:1"})
    create_topic(broker.bootstrap, "starved")
    # Retriable, and "possibly persisted" for the client: the batch is in the log, not synced.
    assert produce_errors(broker.bootstrap, "starved", {0: good_batch([b"x"])}) == {
        0: ErrorCode.not_enough_replicas_after_append
    }
    alive(broker)  # EMFILE is not a storage failure: no halt
    wait_for_line(
        broker, "cannot prepare a flush", DEADLINE, "the flush failure in the broker's log"
    )
    # The next round syncs what the failed one left dirty; an idempotent client is unaffected.
    produce_all(broker.bootstrap, "starved", [b"y", b"z"], **{"enable.idempotence": True})
    assert read_all(broker.bootstrap, "starved") == [b"x", b"y", b"z"]


# -- finding 4: supervised background loops ------------------------------------------------


def failing_loop_broker(
    make_broker: Callable[..., EmbeddedBroker], loop: str, settings: dict[str, str]
) -> EmbeddedBroker:
    """A broker whose background loop `loop` raises in its first round; `settings` make the
    loop run often enough for the test to see its supervisor restart it."""
    return make_broker(settings=settings, env={"ONCEFLOW_RAISE_AT": f"loop.{loop}:1"})


def assert_loop_failed_and_broker_alive(broker: EmbeddedBroker, loop: str) -> None:
    """The loop's exception was logged, not swallowed, and the broker still answers."""
    wait_for_line(
        broker,
        f"background task {loop} failed",
        DEADLINE,
        f"the failure of {loop} in the broker's log",
    )
    alive(broker)


def describe_group(client: WireClient, group: str) -> Any:
    [described] = client.call(DescribeGroupsRequest(groups=(group,))).groups
    return described


def test_session_expiry_survives_an_exception_in_the_group_timer(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    broker = failing_loop_broker(
        make_broker, "group-timer", {"group.min.session.timeout.ms": "500"}
    )
    client = WireClient(broker.bootstrap)
    joined = client.call(
        JoinGroupRequest(
            group_id="g",
            session_timeout=datetime.timedelta(milliseconds=1000),
            rebalance_timeout=datetime.timedelta(milliseconds=1000),
            member_id="",
            protocol_type="consumer",
            protocols=(JoinGroupRequestProtocol(name="range", metadata=b""),),
        )
    )
    assert joined.error_code == ErrorCode.none
    assert len(describe_group(client, "g").members) == 1
    wait_for_line(broker, "background task group-timer failed", DEADLINE, "the injected exception")
    # The member never syncs nor heartbeats: the timer loop, alive, expires it.
    wait_for(lambda: describe_group(client, "g").group_state == "Empty", DEADLINE, "session expiry")
    assert describe_group(client, "g").members == ()
    client.close()
    assert_loop_failed_and_broker_alive(broker, "group-timer")


def test_transaction_timeout_survives_an_exception_in_its_loop(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    broker = failing_loop_broker(
        make_broker,
        "transaction-timeout",
        {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "200"},
    )
    create_topic(broker.bootstrap, "hanging")
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "transactional.id": "hangs",
            "transaction.timeout.ms": 1000,
        }
    )
    producer.init_transactions(WAIT)
    producer.begin_transaction()
    producer.produce("hanging", value=b"never-committed", partition=0)
    assert producer.flush(WAIT) == 0
    # The producer walks away with its transaction open; it pins the last stable offset until
    # the timeout loop, despite its exception, aborts it.
    client = WireClient(broker.bootstrap)

    def state() -> str:
        request = DescribeTransactionsRequest(transactional_ids=("hangs",))
        return client.call(request).transaction_states[0].transaction_state

    wait_for(lambda: state() == "CompleteAbort", DEADLINE, "the timed-out transaction's abort")
    client.close()
    produce_all(broker.bootstrap, "hanging", [b"after"])
    assert read_all(broker.bootstrap, "hanging") == [b"after"]
    assert_loop_failed_and_broker_alive(broker, "transaction-timeout")


def test_retention_survives_an_exception_in_its_loop(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    broker = failing_loop_broker(
        make_broker, "retention", {"log.retention.check.interval.ms": "200"}
    )
    create_topic(broker.bootstrap, "short", **{"retention.ms": "100", "segment.bytes": "1024"})
    for _ in range(5):  # one batch each, so that segments roll
        produce_all(broker.bootstrap, "short", [b"v" * 300])
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "w"})
    try:

        def log_start() -> int:
            low, _ = consumer.get_watermark_offsets(TopicPartition("short", 0), timeout=WAIT)
            return low

        wait_for(lambda: log_start() > 0, DEADLINE, "retention to delete a segment")
    finally:
        consumer.close()
    assert_loop_failed_and_broker_alive(broker, "retention")


# -- finding 11: producer ids the broker never issued ---------------------------------------


def test_producer_ids_never_issued_are_refused_and_real_producers_are_not(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    broker = make_broker()
    create_topic(broker.bootstrap, "pids")

    def real_producers(round_: int) -> None:
        # an idempotent and a transactional producer (the same transactional.id each round)
        value = f"idem-{round_}".encode()
        produce_all(broker.bootstrap, "pids", [value], **{"enable.idempotence": True})
        txn = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "real"})
        txn.init_transactions(WAIT)
        txn.begin_transaction()
        txn.produce("pids", value=f"txn-{round_}".encode(), partition=0)
        txn.commit_transaction(WAIT)

    real_producers(1)

    def fake(pid: int, transactional_id: str | None = None) -> dict[int, ErrorCode]:
        batch = good_batch(
            [b"fake"],
            producer_id=pid,
            producer_epoch=0,
            base_sequence=0,
            transactional=transactional_id is not None,
        )
        request = produce_request("pids", {0: batch})
        request = dataclasses.replace(request, transactional_id=transactional_id)
        with WireClient(broker.bootstrap) as client:
            [answer] = client.call(request).responses
        return {p.index: p.error_code for p in answer.partition_responses}

    # Ids far past anything issued, idempotent or transactional (under a transactional id
    # that exists: without one Kafka refuses transactional records before anything else):
    # refused, nothing stored. The error makes librdkafka and the Java client reset their
    # producer id.
    for pid in (10**9, 10**9 + 1, 2**62):
        assert fake(pid) == {0: ErrorCode.unknown_producer_id}
    assert fake(10**9 + 2, "real") == {0: ErrorCode.unknown_producer_id}

    # The counter is durable: after a restart (kill -9) the same ids are still refused, and
    # the real producers go on.
    broker.restart()
    assert fake(10**9) == {0: ErrorCode.unknown_producer_id}
    real_producers(2)
    assert read_all(broker.bootstrap, "pids") == [b"idem-1", b"txn-1", b"idem-2", b"txn-2"]
    alive(broker)


@pytest.mark.parametrize("count", [2000])
def test_a_flood_of_fake_producer_ids_grows_no_producer_state(
    make_broker: Callable[..., EmbeddedBroker], count: int
) -> None:
    broker = make_broker()
    create_topic(broker.bootstrap, "flood")
    client = WireClient(broker.bootstrap)
    for pid in range(10**6, 10**6 + count):
        batch = good_batch([b"f"], producer_id=pid, producer_epoch=0, base_sequence=0)
        request = ProduceRequest(
            transactional_id=None,
            acks=1,
            timeout=datetime.timedelta(seconds=WAIT),
            topic_data=(
                TopicProduceData(
                    name="flood", partition_data=(PartitionProduceData(index=0, records=batch),)
                ),
            ),
        )
        assert codes(client.call(request)) == {"flood": ErrorCode.unknown_producer_id}
    client.close()
    # DescribeProducers, through confluent's admin client, would list them; the log is empty.
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "x"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition("flood", 0), timeout=WAIT) == (0, 0)
    finally:
        consumer.close()
    alive(broker)
