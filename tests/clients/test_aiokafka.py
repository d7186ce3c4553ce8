"""aiokafka against the broker: admin, produce with every codec, consume, groups."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import CommitFailedError
from aiokafka.structs import OffsetAndMetadata

from tests.clients.stored_batches import assert_idempotent, stored_codecs


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))


async def wait_for(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.02)


async def admin_client(bootstrap: str) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    return admin


async def create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = await admin_client(bootstrap)
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


def consumer(bootstrap: str, *topics: str, **conf: Any) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=200,
        **conf,
    )


async def produce(
    bootstrap: str, topic: str, partitions: int, count: int, **conf: Any
) -> dict[int, list[bytes]]:
    """Send `count` records round-robin over the partitions; what each partition must hold."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all", **conf)
    await producer.start()
    sent: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    try:
        futures = []
        for i in range(count):
            value = b"value-%05d-" % i * 5
            partition = i % partitions
            futures.append(
                await producer.send(topic, value=value, key=b"%d" % i, partition=partition)
            )
            sent[partition].append(value)
        offsets: dict[int, list[int]] = {p: [] for p in range(partitions)}
        for metadata in await asyncio.gather(*futures):
            offsets[metadata.partition].append(metadata.offset)
    finally:
        await producer.stop()
    # Contiguous per partition, in the order sent.
    assert all(o == list(range(o[0], o[0] + len(o))) for o in offsets.values())
    return sent


async def drain(
    c: AIOKafkaConsumer, got: dict[int, list[tuple[int, bytes]]], total: int
) -> dict[int, list[bytes]]:
    """Read until `total` records arrived; checks offsets are contiguous per partition."""
    async with asyncio.timeout(30):
        while sum(map(len, got.values())) < total:
            for tp, msgs in (await c.getmany(timeout_ms=200)).items():
                got.setdefault(tp.partition, []).extend((m.offset, m.value) for m in msgs)
    for records in got.values():
        offsets = [o for o, _ in records]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    return {p: [v for _, v in records] for p, records in got.items()}


async def read_assigned(
    bootstrap: str, topic: str, partitions: int, total: int
) -> dict[int, list[bytes]]:
    """Every record, by assignment (no group), in offset order per partition."""
    c = consumer(bootstrap)
    await c.start()
    try:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        return await drain(c, {}, total)
    finally:
        await c.stop()


def test_admin_create_list_describe_delete(bootstrap: str, topic_name: str) -> None:
    async def scenario() -> None:
        admin = await admin_client(bootstrap)
        try:
            await admin.create_topics(
                [NewTopic(topic_name, 3, 1, topic_configs={"retention.ms": "3600000"})]
            )
            assert topic_name in await admin.list_topics()
            [described] = await admin.describe_topics([topic_name])
            assert len(described["partitions"]) == 3
            [response] = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic_name)]
            )
            assert "3600000" in repr(response)
            await admin.delete_topics([topic_name])
            assert topic_name not in await admin.list_topics()
        finally:
            await admin.close()

    run(scenario())


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_produce_and_consume_by_assignment_each_codec(
    bootstrap: str, topic_name: str, codec: str | None
) -> None:
    async def scenario() -> None:
        await create(bootstrap, topic_name, 3)
        sent = await produce(bootstrap, topic_name, 3, 600, compression_type=codec)
        assert stored_codecs(bootstrap, topic_name, 3) == {codec or "none"}
        assert await read_assigned(bootstrap, topic_name, 3, 600) == sent

    run(scenario())


def test_idempotent_producer(bootstrap: str, topic_name: str) -> None:
    async def scenario() -> None:
        await create(bootstrap, topic_name, 2)
        sent = await produce(bootstrap, topic_name, 2, 200, enable_idempotence=True)
        assert_idempotent(bootstrap, topic_name, 2)
        assert await read_assigned(bootstrap, topic_name, 2, 200) == sent

    run(scenario())


def test_group_consume_commit_and_fetch_offsets(bootstrap: str, topic_name: str) -> None:
    group = f"g-{topic_name}"

    async def scenario() -> None:
        await create(bootstrap, topic_name, 2)
        sent = await produce(bootstrap, topic_name, 2, 100)
        c = consumer(bootstrap, topic_name, group_id=group)
        await c.start()
        try:
            assert await drain(c, {}, 100) == sent
            tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
            await c.commit({tp0: OffsetAndMetadata(30, "half way"), tp1: 50})
            assert (await c.committed(tp0), await c.committed(tp1)) == (30, 50)
        finally:
            await c.stop()
        admin = await admin_client(bootstrap)
        try:
            offsets = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
        assert {tp.partition: (o.offset, o.metadata) for tp, o in offsets.items()} == {
            0: (30, "half way"),
            1: (50, ""),
        }
        # A new member of the group resumes from the committed offsets.
        d = consumer(bootstrap, topic_name, group_id=group)
        await d.start()
        try:
            rest = await drain(d, {}, 20)
        finally:
            await d.stop()
        assert rest == {0: sent[0][30:]}

    run(scenario())


def _partitions(c: AIOKafkaConsumer) -> set[int]:
    return {tp.partition for tp in c.assignment()}


class Member:
    """A group member that polls in its own task and commits after each batch it handles."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.consumer = consumer(bootstrap, topic, group_id=group)
        self.delivered: list[tuple[int, int, bytes]] = []  # (partition, offset, value)
        self.commit_failures = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def partitions(self) -> set[int]:
        return _partitions(self.consumer)

    async def start(self) -> Member:
        await self.consumer.start()
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=50, max_records=10)
            for tp, msgs in batches.items():
                self.delivered.extend((tp.partition, m.offset, m.value) for m in msgs)
            if batches:
                try:
                    await self.consumer.commit()
                except CommitFailedError:
                    self.commit_failures += 1  # a rebalance began: at-least-once redelivery
                await asyncio.sleep(0.02)  # a slow application, so that work spans the rebalance

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self.consumer.stop()  # LeaveGroup


def test_rebalance_when_a_consumer_joins_and_leaves(bootstrap: str, topic_name: str) -> None:
    group = f"g-{topic_name}"

    async def scenario() -> None:
        await create(bootstrap, topic_name, 4)
        sent = await produce(bootstrap, topic_name, 4, 400)
        members: list[Member] = []

        def covered() -> bool:
            seen: dict[int, set[int]] = {p: set() for p in sent}
            for m in members:
                for partition, offset, _ in m.delivered:
                    seen[partition].add(offset)
            return all(seen[p] == set(range(len(sent[p]))) for p in sent)

        a = await Member(bootstrap, group, topic_name).start()
        members.append(a)
        try:
            await wait_for(lambda: a.partitions == {0, 1, 2, 3})
            b = await Member(bootstrap, group, topic_name).start()
            members.append(b)

            def split() -> bool:
                pa, pb = a.partitions, b.partitions
                return bool(pa) and bool(pb) and pa | pb == {0, 1, 2, 3} and not pa & pb

            try:
                await wait_for(split)
                await wait_for(covered)
            finally:
                await b.stop()  # LeaveGroup: a takes everything back
            await wait_for(lambda: a.partitions == {0, 1, 2, 3})
            more = await produce(bootstrap, topic_name, 4, 40)
            for p, values in more.items():
                sent[p].extend(values)
            await wait_for(covered)
        finally:
            await a.stop()
        # Every record reached the group with its own value; exactly once unless a commit failed.
        delivered = a.delivered + b.delivered
        assert all(sent[p][offset] == value for p, offset, value in delivered)
        if a.commit_failures + b.commit_failures == 0:
            assert len(delivered) == sum(map(len, sent.values()))

    run(scenario())
