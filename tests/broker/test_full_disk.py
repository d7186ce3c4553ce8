"""A full disk (simulated in the log layer, as `onceflow verify` does where it cannot mount a
small filesystem): the broker halts on the first write it cannot make, as Kafka does, comes
back once there is room, and has lost nothing it acknowledged."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from confluent_kafka import KafkaError, Producer

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.halt import HALT_EXIT_CODE
from onceflow.log.full_disk import FULL_DISK_ENV
from tests.confluent import consume_all, create_topic


def produce(bootstrap: str, topic: str, values: list[bytes]) -> list[KafkaError | None]:
    """One delivery result per value (None: acknowledged)."""
    results: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 5000})
    for value in values:
        producer.produce(topic, value, on_delivery=lambda err, _msg: results.append(err))
    producer.flush(30)
    return results


def test_a_full_disk_halts_the_broker_and_loses_nothing_acknowledged(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path, topic_name: str
) -> None:
    flag = tmp_path / "disk-is-full"
    broker = make_broker(env={FULL_DISK_ENV: str(flag)})
    create_topic(broker.bootstrap, topic_name, 1)
    before = [f"v{i}".encode() for i in range(50)]
    assert produce(broker.bootstrap, topic_name, before) == [None] * 50

    flag.touch()  # the disk fills up
    [refused] = produce(broker.bootstrap, topic_name, [b"no room"])
    assert refused is not None  # never acknowledged
    assert broker.process is not None
    assert broker.process.wait(30) == HALT_EXIT_CODE  # halted, no clean-shutdown writes

    flag.unlink()  # room again
    broker.start()
    assert [m.value() for m in consume_all(broker.bootstrap, topic_name, 1)] == before  # type: ignore[attr-defined]
    assert produce(broker.bootstrap, topic_name, [b"after"]) == [None]
