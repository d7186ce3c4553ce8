"""Log compaction in the running broker, seen through confluent-kafka: the latest value of
every key stays at its offset and older ones go, consumers read across the gaps, tombstones go
after delete.retention.ms, aborted transactions' records go and committed ones stay, an open
transaction is never touched, producer state survives a clean and a restart, and a kill -9 at
any step of a clean restarts to the same content."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
from kio.schema.errors import ErrorCode
from kio.schema.produce.v8.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.types import TopicName
from kio.static.primitive import i16, i32, i32Timedelta

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.fault_points import POINTS
from onceflow.records.builder import build_batch
from tests.admin_requests import call, init_producer_id
from tests.confluent import create_topic
from tests.waiting import wait_for

BROKER_SETTINGS = {"log.cleaner.backoff.ms": "50", "group.initial.rebalance.delay.ms": "0"}
TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.bytes": "4096",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "600000",
}
KEYS = 20
STARTED_MS = int(time.time() * 1000)  # producer state expires by batch timestamps
ROUNDS = 8


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(tmp_path_factory.mktemp("compaction"), settings=BROKER_SETTINGS) as started:
        yield started


def produce(
    bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]], **conf: object
) -> list[int]:
    """Produce in order (idempotent, acks=all); the offsets the broker gave each record."""
    offsets: list[int] = [-1] * len(records)
    errors: list[KafkaError] = []

    def on_delivery(n: int) -> Callable[[KafkaError | None, object], None]:
        def done(err: KafkaError | None, msg: object) -> None:
            if err is not None:
                errors.append(err)
            else:
                offsets[n] = msg.offset()  # type: ignore[attr-defined]

        return done

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 0,
            "batch.size": 1500,
            **conf,
        }
    )
    for n, (key, value) in enumerate(records):
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery(n))
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not errors, errors
    return offsets


def read(
    bootstrap: str, topic: str, *, committed: bool = False, timeout: float = 30
) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record below the high watermark, across gaps."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
        }
    )
    try:
        tp = TopicPartition(topic, 0)
        low, high = consumer.get_watermark_offsets(tp, timeout=10)
        if committed:
            # the last stable offset is the end for a read_committed reader
            high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
        consumer.assign([TopicPartition(topic, 0, low)])
        out: list[tuple[int, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + timeout
        while True:
            position = consumer.position([tp])[0].offset
            if position >= high:
                break
            assert time.monotonic() < deadline, f"read up to {position} of {high}"
            for msg in consumer.consume(1000, timeout=0.2):
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise AssertionError(msg.error())
                out.append((msg.offset(), msg.key(), msg.value()))
        return [r for r in out if r[0] < high]
    finally:
        consumer.close()


def fill(bootstrap: str, topic: str, segments: int = 3) -> list[int]:
    """Keyed filler records, enough to roll `segments` segments past what came before."""
    records = [(f"fill-{n}".encode(), b"f" * 200) for n in range(segments * 10)]
    return produce(bootstrap, topic, records)


def rounds_of_updates(bootstrap: str, topic: str) -> dict[bytes, tuple[int, bytes]]:
    """KEYS keys updated ROUNDS times; returns the latest (offset, value) of each key."""
    records = [
        (f"k{k}".encode(), f"k{k}-r{r}".encode()) for r in range(ROUNDS) for k in range(KEYS)
    ]
    offsets = produce(bootstrap, topic, records)
    latest = {}
    for (key, value), offset in zip(records, offsets, strict=True):
        latest[key] = (offset, value)
    return latest


def compacted(latest: dict[bytes, tuple[int, bytes]]) -> Callable[[list], bool]:
    """Whether a read of the topic shows exactly the latest value of every updated key."""
    wanted = sorted((o, k, v) for k, (o, v) in latest.items())

    def check(records: list) -> bool:
        return sorted(r for r in records if r[1] in latest) == wanted

    return check


def test_latest_value_per_key_survives_at_its_offset(broker: EmbeddedBroker, topic_name: str):
    create_topic(broker.bootstrap, topic_name, **TOPIC_CONFIGS)
    latest = rounds_of_updates(broker.bootstrap, topic_name)
    fillers = fill(broker.bootstrap, topic_name)
    done = compacted(latest)
    wait_for(lambda: done(read(broker.bootstrap, topic_name)), what="compaction")
    for committed in (False, True):
        records = read(broker.bootstrap, topic_name, committed=committed)
        assert done(records)
        # the fillers are all there (distinct keys), at their offsets, in order
        fill_offsets = [o for o, k, _ in records if k.startswith(b"fill-")]
        assert fill_offsets == sorted(fillers)[: len(fill_offsets)]
        assert fill_offsets[: len(fillers) - 10] == fillers[: len(fillers) - 10]
        offsets = [o for o, _, _ in records]
        assert offsets == sorted(offsets)


def test_tombstones_go_after_delete_retention(broker: EmbeddedBroker, topic_name: str):
    create_topic(broker.bootstrap, topic_name, **{**TOPIC_CONFIGS, "delete.retention.ms": "3000"})
    produce(broker.bootstrap, topic_name, [(b"gone", b"v1"), (b"kept", b"v1")])
    # No clean can see the tombstone before it is written, so its delete horizon (the first
    # clean that saw it + delete.retention.ms) is at least 3 s after this moment.
    before_tombstone = time.monotonic()
    (tombstone,) = produce(broker.bootstrap, topic_name, [(b"gone", None)])
    fill(broker.bootstrap, topic_name)

    def only_tombstone() -> bool:
        records = [r for r in read(broker.bootstrap, topic_name) if r[1] == b"gone"]
        return records == [(tombstone, b"gone", None)]

    wait_for(only_tombstone, what="the old value cleaned, the tombstone kept")
    cleaned_at = time.monotonic()
    # more dirty data: the next rounds drop the tombstone, once its horizon has passed
    while True:
        fill(broker.bootstrap, topic_name, segments=1)
        records = read(broker.bootstrap, topic_name)
        gone = [r for r in records if r[1] == b"gone"]
        if not gone:
            break
        assert gone == [(tombstone, b"gone", None)]
        assert time.monotonic() - cleaned_at < 60, "the tombstone was never removed"
        time.sleep(0.5)
    assert time.monotonic() - before_tombstone >= 3.0  # not before delete.retention.ms
    assert [r[2] for r in records if r[1] == b"kept"] == [b"v1"]


def test_transactions(broker: EmbeddedBroker, topic_name: str):
    """Aborted records go, committed ones stay, an open transaction is never touched."""
    create_topic(broker.bootstrap, topic_name, **TOPIC_CONFIGS)
    bootstrap = broker.bootstrap
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic_name}"})
    txn.init_transactions(10)
    txn.begin_transaction()
    for n in range(5):
        txn.produce(topic_name, key=f"aborted-{n}".encode(), value=b"a")
    txn.flush(10)
    txn.abort_transaction(10)
    txn.begin_transaction()
    for n in range(5):
        txn.produce(topic_name, key=f"committed-{n}".encode(), value=b"c")
    txn.commit_transaction(10)
    fill(bootstrap, topic_name)

    def aborted_gone() -> bool:
        keys = [r[1] for r in read(bootstrap, topic_name)]
        return not any(k.startswith(b"aborted-") for k in keys)

    wait_for(aborted_gone, what="aborted records removed")
    for committed in (False, True):
        keys = [r[1] for r in read(bootstrap, topic_name, committed=committed)]
        assert [k for k in keys if k.startswith(b"committed-")] == [
            f"committed-{n}".encode() for n in range(5)
        ]

    # an open transaction: its records stay, and whatever follows it stays uncleaned
    opened = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"open-{topic_name}"})
    opened.init_transactions(10)
    opened.begin_transaction()
    for n in range(3):
        opened.produce(topic_name, key=b"open", value=f"o{n}".encode())
    opened.flush(10)
    after = produce(bootstrap, topic_name, [(b"open", b"plain")] + [(b"x", b"y" * 300)] * 20)
    time.sleep(1)  # rounds run every 50 ms: give them the chance to do wrong
    values = [r[2] for r in read(bootstrap, topic_name) if r[1] == b"open"]
    assert values == [b"o0", b"o1", b"o2", b"plain"]
    assert after[0] > 0
    opened.commit_transaction(10)

    def committed_open() -> bool:
        values = [r[2] for r in read(bootstrap, topic_name, committed=True) if r[1] == b"open"]
        return values in ([b"o0", b"o1", b"o2", b"plain"], [b"plain"])

    # EndTxn is answered once PrepareCommit is durable, as in Kafka; the COMMIT marker, which
    # moves the last stable offset past the transaction, is written after.
    wait_for(committed_open, what="the committed transaction visible to read_committed")


# -- producer state, crashes, deletion ------------------------------------------------------


def _producers(bootstrap: str, topic: str) -> list[tuple[int, int, int]]:
    """DescribeProducers: (producer id, epoch, last sequence) of the partition's producers."""
    request = DescribeProducersRequest(
        topics=(TopicRequest(name=TopicName(topic), partition_indexes=(i32(0),)),)
    )
    response = call(bootstrap, request)
    [partition] = response.topics[0].partitions
    assert partition.error_code == ErrorCode.none
    return sorted(
        (p.producer_id, p.producer_epoch, p.last_sequence) for p in partition.active_producers
    )


def _produce_keyed(
    bootstrap: str, topic: str, producer: tuple[int, int], sequence: int, keys: list[bytes]
) -> tuple[ErrorCode, int]:
    """One idempotent batch over a raw connection (a retry is the very same bytes)."""
    batch = build_batch(
        [(k, b"value-" + k, (), STARTED_MS) for k in keys],
        producer_id=producer[0],
        producer_epoch=producer[1],
        base_sequence=sequence,
    )
    request = ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        topic_data=(
            TopicProduceData(
                name=TopicName(topic),
                partition_data=(PartitionProduceData(index=i32(0), records=batch),),
            ),
        ),
    )
    response = call(bootstrap, request)
    [part] = response.responses[0].partition_responses
    return part.error_code, part.base_offset


def test_an_idempotent_retry_after_a_clean_and_a_restart_is_a_duplicate(
    make_broker: Callable[..., EmbeddedBroker], topic_name: str
) -> None:
    broker = make_broker(settings=BROKER_SETTINGS)
    create_topic(broker.bootstrap, topic_name, **TOPIC_CONFIGS)
    error, pid, epoch = init_producer_id(broker.bootstrap)
    assert error == ErrorCode.none
    keys = [b"same"] * 5
    first = _produce_keyed(broker.bootstrap, topic_name, (pid, epoch), 0, keys)
    last = _produce_keyed(broker.bootstrap, topic_name, (pid, epoch), 5, keys)
    assert first[0] == last[0] == ErrorCode.none
    fill(broker.bootstrap, topic_name)
    described = _producers(broker.bootstrap, topic_name)
    assert (pid, epoch, 9) in described

    def cleaned() -> bool:
        records = read(broker.bootstrap, topic_name)
        return [r[0] for r in records if r[1] == b"same"] == [last[1] + 4]

    wait_for(cleaned, what="the producer's batches cleaned to its last record")
    broker.kill()
    broker.restart()
    assert _producers(broker.bootstrap, topic_name) == described
    # the retry of the last batch is answered with its offsets, not appended again
    assert _produce_keyed(broker.bootstrap, topic_name, (pid, epoch), 5, keys) == last
    # and the next sequence follows on
    assert _produce_keyed(broker.bootstrap, topic_name, (pid, epoch), 10, [b"same"])[0] == (
        ErrorCode.none
    )
    offsets = [r[0] for r in read(broker.bootstrap, topic_name) if r[1] == b"same"]
    assert offsets[0] == last[1] + 4


CRASH_POINTS = sorted(p for p in POINTS if p.startswith("cleaner."))


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_kill_9_mid_clean_restarts_to_the_same_content(
    make_broker: Callable[..., EmbeddedBroker], topic_name: str, tmp_path: Path, point: str
) -> None:
    """Written under the delete policy, switched to compact (IncrementalAlterConfigs): the
    first clean dies at `point`; after the restart, read with the cleaner off, every record is
    one that was written at that offset and nothing live is missing; with it on, the clean
    finishes."""
    data = tmp_path / "data"
    broker = make_broker(data, settings=BROKER_SETTINGS, env={"ONCEFLOW_CRASH_AT": point})
    bootstrap = broker.bootstrap
    create_topic(bootstrap, topic_name, **{**TOPIC_CONFIGS, "cleanup.policy": "delete"})
    latest = rounds_of_updates(bootstrap, topic_name)
    fillers = fill(bootstrap, topic_name)
    written = {r[0]: r for r in read(bootstrap, topic_name)}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    compact = ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic_name, incremental_configs=[compact])
    admin.incremental_alter_configs([resource])[resource].result(10)
    wait_for(lambda: broker.process.poll() is not None, what=f"the crash at {point}")

    broker.env = {}
    broker.settings = {**BROKER_SETTINGS, "log.cleaner.enable": "false"}
    broker.restart()
    records = read(bootstrap, topic_name)
    assert all(written[r[0]] == r for r in records), "a record changed or appeared"
    offsets = {r[0] for r in records}
    assert {o for o, _ in latest.values()} <= offsets, "a live record is missing"
    assert set(fillers) <= offsets
    assert not list((data / f"{topic_name}-0").glob("*.cleaned"))

    broker.kill()
    broker.settings = BROKER_SETTINGS
    broker.restart()
    done = compacted(latest)
    wait_for(lambda: done(read(bootstrap, topic_name)), what="the clean after the restart")


def test_a_topic_deleted_during_a_clean(
    make_broker: Callable[..., EmbeddedBroker], topic_name: str
) -> None:
    broker = make_broker(
        settings=BROKER_SETTINGS, env={"ONCEFLOW_DELAY_AT": "cleaner.before-swap:1500:1"}
    )
    create_topic(broker.bootstrap, topic_name, **TOPIC_CONFIGS)
    rounds_of_updates(broker.bootstrap, topic_name)
    fill(broker.bootstrap, topic_name)
    directory = broker.data_dir / f"{topic_name}-0"
    wait_for(lambda: list(directory.glob("*.log.cleaned")), what="a clean under way")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics([topic_name])[topic_name].result(10)
    wait_for(lambda: not directory.exists(), what="the directory removed")
    # the broker goes on, and cleans a new topic of the same name
    create_topic(broker.bootstrap, topic_name, **TOPIC_CONFIGS)
    latest = rounds_of_updates(broker.bootstrap, topic_name)
    fill(broker.bootstrap, topic_name)
    done = compacted(latest)
    wait_for(lambda: done(read(broker.bootstrap, topic_name)), what="the new topic cleaned")
    assert broker.process.poll() is None
    assert not [p for p in broker.data_dir.iterdir() if p.name.startswith(f"{topic_name}-0.")]
