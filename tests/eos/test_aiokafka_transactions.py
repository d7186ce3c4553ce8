"""aiokafka transactional producers (AIOKafkaProducer(transactional_id=...)) and its
read_committed consumer against the broker: commit, abort, atomicity over several partitions,
fencing of a zombie, the broker's transaction timeout, consume-transform-produce with
send_offsets_to_transaction, and the errors for client mistakes. aiokafka speaks the oldest
versions (InitProducerId v0, EndTxn v0, TxnOffsetCommit v0), so these cover them."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Coroutine, Mapping
from typing import Any

import aiokafka.errors as errors
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from onceflow.broker.embedded import EmbeddedBroker
from tests.admin_requests import list_offsets
from tests.confluent import TP, create_topics, partitions_of
from tests.eos import client_transactions as shared
from tests.eos.checker import read_back, wait_settled

FENCED = (errors.ProducerFenced, errors.InvalidProducerEpoch)


def run(coro: Coroutine[Any, Any, None], timeout: float = 60) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout))


async def producer_for(bootstrap: str, transactional_id: str, **conf: Any) -> AIOKafkaProducer:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=transactional_id, linger_ms=2, **conf
    )
    await producer.start()  # InitProducerId
    return producer


async def send_all(producer: AIOKafkaProducer, records: list[tuple[str, int, bytes]]) -> None:
    futures = [await producer.send(t, v, partition=p) for t, p, v in records]
    await asyncio.gather(*futures)  # raises if a record was not acknowledged


async def read_with_aiokafka(
    bootstrap: str, ends: Mapping[TP, int], isolation_level: str, timeout: float = 20
) -> dict[TP, list[bytes]]:
    """aiokafka's own consumer from offset 0 until its position reaches each end."""
    consumer = AIOKafkaConsumer(**shared.own_consumer_conf(bootstrap, isolation_level))
    await consumer.start()
    tps = shared.assign_from_start(consumer, ends, TopicPartition)
    out: dict[TP, list[bytes]] = {tp: [] for tp in ends}
    deadline = time.monotonic() + timeout
    try:
        while True:
            positions = [await consumer.position(tp) for tp in tps]
            if all(
                pos >= ends[(tp.topic, tp.partition)]
                for tp, pos in zip(tps, positions, strict=True)
            ):
                break
            assert time.monotonic() < deadline, f"{isolation_level}: short of {ends}"
            batch = await consumer.getmany(timeout_ms=100)
            for tp, messages in batch.items():
                end = ends[(tp.topic, tp.partition)]
                out[(tp.topic, tp.partition)] += [m.value for m in messages if m.offset < end]
    finally:
        await consumer.stop()
    return out


def test_commit_and_abort_seen_by_both_isolation_levels(bootstrap: str, topic_name: str) -> None:
    create_topics(bootstrap, {topic_name: 2})
    tps = partitions_of({topic_name: 2})

    async def scenario() -> None:
        producer = await producer_for(bootstrap, f"ak-{topic_name}")
        for prefix, commit in shared.BATCHES:
            await producer.begin_transaction()
            await send_all(producer, shared.over_two_partitions(topic_name, prefix, 8))
            if commit:
                await producer.commit_transaction()
            else:
                await producer.abort_transaction()
        await producer.stop()
        wait_settled(bootstrap, tps)
        lso = list_offsets(bootstrap, tps, 1)
        own_committed = await read_with_aiokafka(bootstrap, lso, "read_committed")
        own_uncommitted = await read_with_aiokafka(bootstrap, lso, "read_uncommitted")
        read = read_back(bootstrap, tps)
        shared.check_commit_and_abort(topic_name, read, own_committed, own_uncommitted)

    run(scenario())


def test_transaction_over_two_topics_is_all_or_nothing(bootstrap: str, topic_name: str) -> None:
    topics = {f"{topic_name}-a": 2, f"{topic_name}-b": 1}
    tps = partitions_of(topics)
    create_topics(bootstrap, topics)
    records = [(t, p, f"{t[-1]}{p}-{i}".encode()) for t, p in tps for i in range(4)]

    async def scenario() -> None:
        producer = await producer_for(bootstrap, f"ak-{topic_name}")
        async with producer.transaction():
            await send_all(producer, records)
            assert list_offsets(bootstrap, tps, 1) == dict.fromkeys(tps, 0)
            assert all(r.committed == [] for r in read_back(bootstrap, tps).values())
        await producer.begin_transaction()
        await send_all(producer, [(t, p, b"aborted") for t, p in tps])
        await producer.abort_transaction()
        await producer.stop()
        wait_settled(bootstrap, tps)
        committed = await read_with_aiokafka(
            bootstrap, list_offsets(bootstrap, tps, 1), "read_committed"
        )
        for tp in tps:
            assert committed[tp] == [v for t, p, v in records if (t, p) == tp]

    run(scenario())


def test_zombie_is_fenced_by_a_new_instance(bootstrap: str, topic_name: str) -> None:
    create_topics(bootstrap, {topic_name: 2})
    txn_id = f"ak-{topic_name}"

    async def scenario() -> None:
        zombie = await producer_for(bootstrap, txn_id)
        await zombie.begin_transaction()
        await send_all(zombie, shared.over_two_partitions(topic_name, "z", 4))
        successor = await producer_for(bootstrap, txn_id)

        with pytest.raises(FENCED):
            await send_all(zombie, [(topic_name, 0, b"late")])
        with pytest.raises(FENCED):
            await zombie.commit_transaction()
        await zombie.stop()

        async with successor.transaction():
            await send_all(successor, shared.over_two_partitions(topic_name, "n", 4))
        await successor.stop()

    run(scenario())
    shared.check_successor_won(bootstrap, topic_name, shared.values("n", 4))


def test_hung_transaction_is_aborted_by_the_broker_timeout(
    timeout_broker: EmbeddedBroker, topic_name: str
) -> None:
    bootstrap, tp, txn_id = shared.hung_transaction_setup(timeout_broker, topic_name, "ak")

    async def scenario() -> None:
        hung = await producer_for(bootstrap, txn_id, transaction_timeout_ms=1500)
        await hung.begin_transaction()
        await send_all(hung, [(topic_name, 0, v) for v in shared.values("hung", 3)])
        plain = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await plain.start()
        await plain.send_and_wait(topic_name, b"after", partition=0)
        await plain.stop()
        await asyncio.to_thread(shared.check_hung_then_aborted, bootstrap, tp, txn_id)
        assert await read_with_aiokafka(bootstrap, {tp: 5}, "read_committed") == {tp: [b"after"]}
        with pytest.raises(FENCED):
            await hung.commit_transaction()
        await hung.stop()

    run(scenario())


def test_consume_transform_produce_offsets_stick_only_on_commit(
    bootstrap: str, topic_name: str
) -> None:
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topics(bootstrap, {source: 1, sink: 1})
    group = f"g-{topic_name}"
    source_tp = TopicPartition(source, 0)
    tps = [(source, 0), (sink, 0)]

    async def committed() -> int | None:
        checker = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
        await checker.start()
        try:
            return await checker.committed(source_tp)
        finally:
            await checker.stop()

    async def scenario() -> list[bytes]:
        plain = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await plain.start()
        for i in range(10):
            await plain.send(source, f"in-{i}".encode(), partition=0)
        await plain.stop()  # flushes
        consumer = AIOKafkaConsumer(
            source,
            bootstrap_servers=bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        await consumer.start()
        inputs: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 30
        while len(inputs) < 10:
            assert time.monotonic() < deadline, inputs
            for messages in (await consumer.getmany(timeout_ms=200)).values():
                inputs += [(m.offset, m.value) for m in messages]
        producer = await producer_for(bootstrap, f"ak-{topic_name}")

        async def transform(start: int, upto: int, commit: bool) -> None:
            await producer.begin_transaction()
            await send_all(producer, [(sink, 0, v.upper()) for o, v in inputs if start <= o < upto])
            await producer.send_offsets_to_transaction({source_tp: upto}, group)
            if commit:
                await producer.commit_transaction()
            else:
                await producer.abort_transaction()
            await asyncio.to_thread(wait_settled, bootstrap, tps)

        await transform(0, 4, commit=True)
        assert await committed() == 4
        await transform(4, 10, commit=False)
        assert await committed() == 4
        await transform(4, 10, commit=True)
        assert await committed() == 10
        await consumer.stop()
        await producer.stop()
        return [v for _, v in inputs]

    inputs: list[bytes] = []

    async def main() -> None:
        inputs.extend(await scenario())

    run(main())
    read = read_back(bootstrap, [(sink, 0)])[(sink, 0)]
    assert read.committed == [v.upper() for v in inputs]
    assert len(read.uncommitted) == 16  # with the aborted copy of the last six


def test_client_mistakes(bootstrap: str, topic_name: str) -> None:
    create_topics(bootstrap, {topic_name: 1})

    async def scenario() -> None:
        too_long = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            transactional_id=f"ak-{uuid.uuid4().hex[:8]}",
            transaction_timeout_ms=900_001,  # the broker's transaction.max.timeout.ms + 1
        )
        with pytest.raises(errors.InvalidTransactionTimeout):
            await too_long.start()
        await too_long.stop()

        producer = await producer_for(bootstrap, f"ak-{topic_name}")
        # aiokafka refuses these locally (with an assertion of its state table) and never
        # sends them
        for action in (producer.commit_transaction, producer.abort_transaction):
            with pytest.raises(AssertionError, match="Invalid state transition"):
                await action()
        with pytest.raises(errors.IllegalOperation):
            await producer.send(topic_name, b"outside")
        async with producer.transaction():
            await send_all(producer, [(topic_name, 0, b"inside")])
        await producer.stop()

    run(scenario())
    shared.check_committed(bootstrap, (topic_name, 0), [b"inside"])
