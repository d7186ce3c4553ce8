"""kill -9 of the broker under acks=all load: every acknowledged record survives, in order,
and so do committed group offsets."""

from __future__ import annotations

import threading
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from onceflow.broker.embedded import EmbeddedBroker
from tests.confluent import consume_all, create_topic
from tests.waiting import wait_for


class AckRecorder:
    """Produces continuously from a thread; records what the broker acknowledged."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.acked: list[tuple[int, int, bytes]] = []
        self.failed: list[KafkaError] = []
        self._stop = threading.Event()
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 2,
                "max.in.flight.requests.per.connection": 1,
                "message.timeout.ms": 60000,
                "retry.backoff.ms": 50,
                "reconnect.backoff.max.ms": 200,
            }
        )
        self.topic = topic
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _on_delivery(self, err: KafkaError | None, msg: object) -> None:
        if err is not None:
            self.failed.append(err)
        else:
            self.acked.append((msg.partition(), msg.offset(), msg.value()))  # type: ignore[attr-defined]

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                self.producer.produce(
                    self.topic,
                    value=f"v{n}".encode(),
                    key=str(n).encode(),
                    on_delivery=self._on_delivery,
                )
                n += 1
            except BufferError:
                pass
            self.producer.poll(0 if n % 100 else 0.001)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()
        assert self.producer.flush(60) == 0


def test_acked_records_and_offsets_survive_kill_9(
    make_broker: Callable[..., EmbeddedBroker], topic_name: str
) -> None:
    broker = make_broker()
    create_topic(broker.bootstrap, topic_name, partitions=3)
    group = f"g-{topic_name}"
    committer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    committer.commit(
        offsets=[TopicPartition(topic_name, p, 7 + p) for p in range(3)], asynchronous=False
    )
    committer.close()

    recorder = AckRecorder(broker.bootstrap, topic_name)
    recorder.thread.start()
    for round_ in range(3):  # three crashes mid-stream
        wait_for(lambda r=round_: len(recorder.acked) >= 3000 * (r + 1), 60)
        broker.kill()
        broker.start()
    wait_for(lambda: len(recorder.acked) >= 12000, 60)
    recorder.stop()
    assert recorder.failed == []

    acked = recorder.acked
    got = consume_all(broker.bootstrap, topic_name, 3, timeout=60)
    stored = {(m.partition(), m.offset()): m.value() for m in got}
    missing = [(p, o, v) for p, o, v in acked if stored.get((p, o)) != v]
    assert missing == [], f"{len(missing)} acknowledged records lost or changed"
    for p in range(3):  # offsets are contiguous: no hole was left by a torn write
        offsets = sorted(o for (q, o) in stored if q == p)
        assert offsets == list(range(len(offsets)))

    check = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    committed = check.committed([TopicPartition(topic_name, p) for p in range(3)], timeout=10)
    assert [tp.offset for tp in committed] == [7, 8, 9]
    check.close()
