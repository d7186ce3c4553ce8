"""The job every third-party application here runs, its model and its checker.

Input: a known keyed sequence, each event `{"key", "seq", "v"}` (seq numbers the events of one
key). The application keeps per key the running count and sum of `v` in its framework's state
(with a changelog topic) and emits for every event `{"key", "seq", "count", "sum"}`. Exactly
once means: every input event has exactly one committed output, in per-key order, with the
count and sum of exactly the events before it, no matter where the application was killed.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from tests.confluent import QUIET
from tests.eos.checker import read_back
from tests.thirdparty.app_process import AppProcess


@dataclass(frozen=True)
class Event:
    key: str
    seq: int
    v: int

    def encode(self) -> bytes:
        return json.dumps({"key": self.key, "seq": self.seq, "v": self.v}).encode()


def keyed_events(count: int, keys: int, seed: int) -> list[Event]:
    """`count` events over `keys` keys, the keys drawn at random so that they interleave."""
    rng = random.Random(seed)
    next_seq: dict[str, int] = defaultdict(int)
    events = []
    for _ in range(count):
        key = f"k{rng.randrange(keys)}"
        events.append(Event(key, next_seq[key], rng.randrange(1, 1000)))
        next_seq[key] += 1
    return events


def probe_events(events: Iterable[Event]) -> list[Event]:
    """One more event per key: its output shows the state the application holds for the key."""
    last: dict[str, Event] = {}
    for event in events:
        last[event.key] = event
    return [Event(key, e.seq + 1, 1_000_000) for key, e in sorted(last.items())]


def expected_outputs(events: Iterable[Event]) -> dict[str, list[dict[str, Any]]]:
    """The model: per key, the output of every event in order."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    totals: dict[str, int] = defaultdict(int)
    for e in events:
        totals[e.key] += e.v
        out[e.key].append({"key": e.key, "seq": e.seq, "count": e.seq + 1, "sum": totals[e.key]})
    return dict(out)


def produce_events(bootstrap: str, topic: str, events: Iterable[Event]) -> None:
    """Idempotent producer, keyed. Small batches, so that an application fetching little at a
    time interleaves the partitions (a kill then lands mid-stream in every one)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "batch.num.messages": 20,
            **QUIET,
        }
    )
    failures: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    for event in events:
        producer.produce(topic, key=event.key.encode(), value=event.encode(), callback=on_delivery)
        producer.poll(0)
    assert producer.flush(30) == 0, "input not all delivered"
    assert not failures, failures


class CommittedOutputs:
    """Follows the output topic with read_committed, for the test's wait conditions."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"progress-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 50,
                **QUIET,
            }
        )
        start = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        self.consumer.assign(start)
        self.count = 0
        self.seen: set[tuple[str, int]] = set()
        self.per_key: Counter[str] = Counter()

    def poll(self) -> None:
        for msg in self.consumer.consume(1000, timeout=0.1):
            assert msg.error() is None, msg.error()
            value = json.loads(msg.value())
            self.count += 1
            self.seen.add((value["key"], value["seq"]))
            self.per_key[value["key"]] += 1

    def wait_for(
        self, condition: Callable[[], bool], app: AppProcess, timeout: float, what: str
    ) -> None:
        """Poll until `condition`; fails at once, with the app's log, if the app died."""
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            if condition():
                return
            assert app.alive(), f"the application exited while waiting for {what}:\n{app.tail()}"
            assert time.monotonic() < deadline, (
                f"{what}: not met within {timeout} s ({self.count} outputs):\n{app.tail()}"
            )

    def partway(self, events: Iterable[Event], at_least: int) -> bool:
        """Every key has at least `at_least` outputs and none has all of them."""
        totals = Counter(e.key for e in events)
        return all(at_least <= self.per_key[key] < n for key, n in totals.items())

    def covers(self, events: Iterable[Event]) -> bool:
        return all((e.key, e.seq) in self.seen for e in events)

    def close(self) -> None:
        self.consumer.close()


def committed_outputs(bootstrap: str, topic: str, partitions: int) -> dict[str, list[dict]]:
    """Per key, the outputs a read_committed reader sees, in offset order (a key has one
    partition, so that is the order the application committed them in)."""
    read = read_back(bootstrap, [(topic, p) for p in range(partitions)])
    by_key: dict[str, list[dict]] = defaultdict(list)
    for p in range(partitions):
        for raw in read[(topic, p)].committed:
            value = json.loads(raw)
            by_key[value["key"]].append(value)
    return dict(by_key)


def differences(
    got: dict[str, list[dict[str, Any]]], expected: dict[str, list[dict[str, Any]]]
) -> list[str]:
    """Per key, the first place where the outputs leave the model (duplicate, gap, value)."""
    problems = []
    for key in sorted(set(got) | set(expected)):
        have, want = got.get(key, []), expected.get(key, [])
        for i in range(max(len(have), len(want))):
            h = have[i] if i < len(have) else None
            w = want[i] if i < len(want) else None
            if h != w:
                problems.append(
                    f"{key}: output #{i} is {h}, the model says {w} "
                    f"({len(have)} outputs, {len(want)} expected)"
                )
                break
    return problems


def read_keyed(
    bootstrap: str, topic: str, partitions: int, isolation: str, timeout: float = 30.0
) -> dict[int, list[tuple[bytes, bytes]]]:
    """Every (key, value) of each partition from offset 0 to its end, in offset order, with
    `isolation` ("read_committed": to the last stable offset, aborted records dropped)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "fetch.wait.max.ms": 50,
            **QUIET,
        }
    )
    out: dict[int, list[tuple[bytes, bytes]]] = {p: [] for p in range(partitions)}
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"{topic}: end not reached in {timeout} s"
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                continue
            out[msg.partition()].append((msg.key(), msg.value()))
    finally:
        consumer.close()
    return out
