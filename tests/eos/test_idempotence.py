"""Idempotent producers across broker crashes: nothing acknowledged is lost, nothing is written
twice, each partition holds exactly what was sent to it, in send order.

The crash point `produce.before-response` kills the broker after a batch is durable but before
the producer hears of it: the producer retries that very batch after the restart, and the
broker must recognise it (producer state rebuilt from the log and its snapshots) and answer
with the original offsets instead of appending it again."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, Producer
from kio.schema.errors import ErrorCode

from onceflow.broker.embedded import EmbeddedBroker
from tests.admin_requests import init_producer_id, produce_batch
from tests.confluent import QUIET, create_topics, partitions_of
from tests.eos.checker import read_back
from tests.waiting import wait_for

PARTITIONS = 3
OK = ErrorCode.none


class IdempotentSender:
    """Produces `p{partition}-{n}` values round-robin from a thread with an idempotent
    producer; records what was sent to each partition and what the broker acknowledged."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.sent: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        self.acked: list[tuple[int, int, bytes]] = []
        self.failed: list[tuple[bytes, KafkaError]] = []
        self.errors: list[KafkaError] = []
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                "message.timeout.ms": 120_000,
                "retry.backoff.ms": 20,
                "retry.backoff.max.ms": 200,
                "reconnect.backoff.ms": 20,
                "reconnect.backoff.max.ms": 200,
                "error_cb": self.errors.append,
                **QUIET,
            }
        )
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.failed.append((msg.value(), err))
        else:
            self.acked.append((msg.partition(), msg.offset(), msg.value()))

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            p = n % PARTITIONS
            value = f"p{p}-{len(self.sent[p])}".encode()
            try:
                self.producer.produce(
                    self.topic, value=value, partition=p, on_delivery=self._on_delivery
                )
            except BufferError:
                self.producer.poll(0.01)
                continue
            self.sent[p].append(value)
            n += 1
            # About 2000 records/s: many small batches in flight (up to 5 per partition), and a
            # volume the final check reads back in a second or two.
            self.producer.poll(0.005 if n % 10 == 0 else 0)

    def start(self) -> IdempotentSender:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()
        assert self.producer.flush(90) == 0, "records left undelivered"

    def check(self, bootstrap: str) -> None:
        """Every partition holds exactly what was sent to it, in order, each value once, and
        every acknowledgement names the offset where the value really is."""
        assert self.failed == [], self.failed[:5]
        assert not [e for e in self.errors if e.fatal()], self.errors
        total = sum(map(len, self.sent.values()))
        assert len(self.acked) == total
        read = read_back(bootstrap, partitions_of({self.topic: PARTITIONS}), timeout=60)
        for p in range(PARTITIONS):
            stored = read[(self.topic, p)]
            assert stored.uncommitted == self.sent[p], _diff(stored.uncommitted, self.sent[p])
            assert stored.committed == self.sent[p]
            assert stored.high_watermark == len(self.sent[p])  # no hole, no extra batch
        wrong = [(p, o, v) for p, o, v in self.acked if read[(self.topic, p)].uncommitted[o] != v]
        assert wrong == [], f"{len(wrong)} acknowledgements name the wrong offset: {wrong[:5]}"


def _diff(got: list[bytes], want: list[bytes]) -> str:
    extra = len(got) - len(set(got))
    missing = set(want) - set(got)
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    return (
        f"{len(got)} stored vs {len(want)} sent; {extra} duplicates; {len(missing)} missing; "
        f"first difference at {first}"
    )


def wait_for_death(broker: EmbeddedBroker, timeout: float = 60) -> None:
    assert broker.process is not None
    wait_for(lambda: broker.process.poll() is not None, timeout, "broker reached crash point")


def test_retry_after_crash_before_response_is_a_duplicate(
    make_broker: Callable[..., EmbeddedBroker], topic_name: str
) -> None:
    crash = {"ONCEFLOW_CRASH_AT": "produce.before-response:40"}
    broker = make_broker(env=crash)
    create_topics(broker.bootstrap, {topic_name: PARTITIONS})
    sender = IdempotentSender(broker.bootstrap, topic_name).start()
    for round_ in range(3):
        wait_for_death(broker)
        if round_ == 2:
            broker.env = {}  # the last restart runs to the end
        broker.start()
    floor = len(sender.acked) + 500
    wait_for(lambda: len(sender.acked) >= floor, 60, "progress after the last restart")
    sender.stop()
    sender.check(broker.bootstrap)


def test_random_kill_9_loses_and_duplicates_nothing(
    make_broker: Callable[..., EmbeddedBroker], topic_name: str
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    broker = make_broker()
    create_topics(broker.bootstrap, {topic_name: PARTITIONS})
    sender = IdempotentSender(broker.bootstrap, topic_name).start()
    for _ in range(4):
        floor = len(sender.acked) + 200
        wait_for(lambda f=floor: len(sender.acked) >= f, 60, f"progress (seed {seed})")
        time.sleep(rng.uniform(0, 0.3))  # a random moment, mid-stream
        broker.kill()
        broker.start()
    floor = len(sender.acked) + 500
    wait_for(lambda: len(sender.acked) >= floor, 60, f"progress (seed {seed})")
    sender.stop()
    sender.check(broker.bootstrap)


# -- the same, request by request -------------------------------------------------------------


def test_duplicates_are_caught_across_restarts(
    make_broker: Callable[..., EmbeddedBroker], topic_name: str
) -> None:
    """After kill -9 the producer state is rebuilt from the log; after a clean stop it is
    loaded from the snapshot written at shutdown. Either way, a retried batch gets its original
    offsets and is not appended again."""
    broker = make_broker()
    bootstrap = broker.bootstrap
    create_topics(bootstrap, {topic_name: 1})
    tp = (topic_name, 0)
    error, pid, epoch = init_producer_id(bootstrap)
    assert error == ErrorCode.none
    now = int(time.time() * 1000)
    batches = [(0, [b"a0", b"a1", b"a2"], 0), (3, [b"b0", b"b1"], 3)]
    for seq, values, offset in batches:
        assert produce_batch(bootstrap, tp, pid, epoch, seq, values, timestamp=now) == (OK, offset)

    broker.kill()
    broker.start()
    for seq, values, offset in batches:  # retries: answered, not appended
        assert produce_batch(bootstrap, tp, pid, epoch, seq, values, timestamp=now) == (OK, offset)
    error, _ = produce_batch(bootstrap, tp, pid, epoch, 9, [b"gap"])
    assert error == ErrorCode.out_of_order_sequence_number
    batches.append((5, [b"c0"], 5))
    assert produce_batch(bootstrap, tp, pid, epoch, 5, [b"c0"], timestamp=now) == (OK, 5)
    # the same sequences with other records are not a retry (tests/eos/test_sequence_reuse.py)
    error, _ = produce_batch(bootstrap, tp, pid, epoch, 5, [b"other"], timestamp=now)
    assert error == ErrorCode.out_of_order_sequence_number

    assert broker.stop() == 0
    broker.start()
    for seq, values, offset in batches:
        assert produce_batch(bootstrap, tp, pid, epoch, seq, values, timestamp=now) == (OK, offset)
    # KIP-360: the producer may bump its own epoch and restart at sequence 0; the old epoch is
    # then fenced.
    assert produce_batch(bootstrap, tp, pid, epoch + 1, 0, [b"d0"]) == (OK, 6)
    error, _ = produce_batch(bootstrap, tp, pid, epoch, 6, [b"old"])
    assert error == ErrorCode.invalid_producer_epoch

    read = read_back(bootstrap, [tp])[tp]
    assert read.uncommitted == [v for _, values, _ in batches for v in values] + [b"d0"]
    assert read.high_watermark == 7
