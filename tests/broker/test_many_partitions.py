"""Partitions are recovered, created and closed on several threads: a kill -9 after a crash
recovery, in the middle of a clean close, or after a CreateTopics loses nothing acknowledged."""

from __future__ import annotations

import datetime
import signal
import time
from collections.abc import Callable
from pathlib import Path

from kio.schema.errors import ErrorCode
from kio.schema.produce.v8.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.types import TopicName
from kio.static.primitive import i16, i32, i32Timedelta

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.log.recovery import CLEAN_SHUTDOWN_FILE
from onceflow.records.builder import build_batch
from tests.admin_requests import READ_UNCOMMITTED, connect, list_offsets
from tests.confluent import consume_all, create_topic
from tests.waiting import wait_for

PARTITIONS = 300
SETTINGS = {"num.recovery.threads.per.data.dir": "4"}


def _produce_to_each(broker: EmbeddedBroker, topic: str, value: bytes) -> None:
    """One record to every partition, acks=all; each must be acknowledged."""
    batch = build_batch([(None, value, (), int(time.time() * 1000))])
    request = ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=(
            TopicProduceData(
                name=TopicName(topic),
                partition_data=tuple(
                    PartitionProduceData(index=i32(p), records=batch) for p in range(PARTITIONS)
                ),
            ),
        ),
    )
    with connect(broker.bootstrap) as connection:
        response = connection.send(request)
    errors = {p.error_code for r in response.responses for p in r.partition_responses}
    assert errors == {ErrorCode.none}, errors


def _check_values(broker: EmbeddedBroker, topic: str, values: list[bytes]) -> None:
    """Every partition holds exactly `values`, in order."""
    ends = list_offsets(broker.bootstrap, [(topic, p) for p in range(PARTITIONS)], READ_UNCOMMITTED)
    assert set(ends.values()) == {len(values)}, sorted(set(ends.values()))
    records = consume_all(broker.bootstrap, topic, PARTITIONS, timeout=60)
    by_partition: dict[int, list[bytes]] = {}
    for message in records:
        by_partition.setdefault(message.partition(), []).append(message.value())  # type: ignore[attr-defined]
    assert by_partition == {p: values for p in range(PARTITIONS)}


def _markers(data_dir: Path, topic: str) -> int:
    return sum(
        1 for p in range(PARTITIONS) if (data_dir / f"{topic}-{p}" / CLEAN_SHUTDOWN_FILE).exists()
    )


def test_kill_9_around_parallel_recovery_and_close_loses_nothing(
    make_broker: Callable[..., EmbeddedBroker], topic_name: str, tmp_path: Path
) -> None:
    broker = make_broker(tmp_path / "data", settings=SETTINGS)
    create_topic(broker.bootstrap, topic_name, partitions=PARTITIONS)
    _produce_to_each(broker, topic_name, b"one")

    broker.kill()  # after a CreateTopics and acknowledged writes
    broker.start()
    _check_values(broker, topic_name, [b"one"])
    _produce_to_each(broker, topic_name, b"two")  # appended after the recovered tails

    # A kill -9 in the middle of the clean close: some partitions marked clean, maybe not all.
    assert broker.process is not None
    broker.process.send_signal(signal.SIGTERM)
    wait_for(lambda: _markers(tmp_path / "data", topic_name) > 0, 30)
    broker.kill()
    broker.start()
    _check_values(broker, topic_name, [b"one", b"two"])

    _produce_to_each(broker, topic_name, b"three")
    assert broker.stop() == 0
    assert _markers(tmp_path / "data", topic_name) == PARTITIONS
    broker.start()
    _check_values(broker, topic_name, [b"one", b"two", b"three"])
