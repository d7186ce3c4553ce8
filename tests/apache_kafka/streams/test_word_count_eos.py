"""Kafka Streams with processing.guarantee=exactly_once_v2 on onceflow, unchanged: a word count
with a repartition topic and a RocksDB store backed by a compacted changelog (WordCount.java),
its input written by a transactional producer (some transactions aborted). Streams is SIGKILLed
twice and the broker once while it runs; the counts read read_committed are exactly the true
counts and never step back or repeat. Then its state directory is wiped: the store restored
from the changelog continues exactly from the true totals."""

from __future__ import annotations

import itertools
import random
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from onceflow.apache_kafka import Distribution
from onceflow.broker.embedded import EmbeddedBroker
from tests.apache_kafka.exactly_once import transactional_producer, write_transaction
from tests.apache_kafka.streams.word_count import CountsReader, StreamsApp
from tests.confluent import create_topics

PARTITIONS = 2
VOCABULARY = tuple(f"word{i}" for i in range(30))
# Only aborted transactions hold it: a count of it is a read of aborted input.
ABORTED_WORD = "aborted"
SENTENCES_PER_TXN = 8
WORDS_PER_SENTENCE = 5
# Generous: JVMs of seven engineers share two cores.
RUNNING_TIMEOUT_S = 180.0
EXACT_TIMEOUT_S = 240.0


class Input:
    """The transactional writer of sentences, and the true counts of what it committed."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer: Producer = transactional_producer(bootstrap, f"sentences-{topic}")
        self.random = random.Random(21)
        self.truth: Counter[str] = Counter()
        self.transactions = 0
        self.aborted = 0

    def total(self) -> int:
        return sum(self.truth.values())

    def write(self, transactions: int) -> None:
        """`transactions` transactions of sentences; every fourth aborted on purpose."""
        for _ in range(transactions):
            self.transactions += 1
            commit = self.transactions % 4 != 0
            sentences = [
                [self.random.choice(VOCABULARY) for _ in range(WORDS_PER_SENTENCE)]
                + ([] if commit else [ABORTED_WORD])
                for _ in range(SENTENCES_PER_TXN)
            ]
            values = [" ".join(words).encode() for words in sentences]
            committed = write_transaction(
                self.producer, self.topic, values, partitions=range(PARTITIONS), commit=commit
            )
            assert committed or not commit, "librdkafka aborted a transaction we committed"
            if committed:
                for words in sentences:
                    self.truth.update(words)
            else:
                self.aborted += 1


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """onceflow in its own process, so it can be SIGKILLed and restarted on its data."""
    broker = EmbeddedBroker(
        tmp_path / "broker", settings={"group.initial.rebalance.delay.ms": "0"}
    ).start()
    try:
        yield broker
    finally:
        broker.kill()


@pytest.fixture
def make_app(
    apache_kafka: Distribution, word_count_classes: Path, tmp_path: Path
) -> Iterator[Callable[..., StreamsApp]]:
    apps: list[StreamsApp] = []

    def make(bootstrap: str, input_topic: str, output_topic: str) -> StreamsApp:
        properties = {
            "bootstrap.servers": bootstrap,
            "application.id": f"word-count-{uuid.uuid4().hex[:8]}",
            "state.dir": str(tmp_path / "state"),
            "commit.interval.ms": "200",
            # Purge the repartition topic often (DeleteRecords), not every 30 s.
            "repartition.purge.interval.ms": "1000",
            # A killed instance's member leaves the group in 10 s, not the default 45 s.
            "session.timeout.ms": "10000",
            "heartbeat.interval.ms": "1000",
            "processing.exception.handler.global.enabled": "true",
        }
        app = StreamsApp(
            apache_kafka, word_count_classes, properties, tmp_path, input_topic, output_topic
        )
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.kill()


def wait_exact(reader: CountsReader, truth: Counter[str], app: StreamsApp) -> None:
    """Until the latest committed count of every word is its true count."""
    deadline = time.monotonic() + EXACT_TIMEOUT_S
    while reader.latest() != dict(truth):
        app.check_alive()
        if time.monotonic() >= deadline:
            latest = reader.latest()
            wrong = {
                w: (latest.get(w), truth.get(w))
                for w in sorted({*latest, *truth})
                if latest.get(w) != truth.get(w)
            }
            raise AssertionError(
                f"counts not exact after {EXACT_TIMEOUT_S} s: (output, truth) {wrong}\n"
                + app.tail()
            )
        reader.poll()


def wait_progress(reader: CountsReader, app: StreamsApp, beyond: int) -> None:
    """Until Streams has committed counts of more than `beyond` words in all: it has begun on
    the input written since, and is likely still at it."""
    deadline = time.monotonic() + RUNNING_TIMEOUT_S
    while sum(reader.latest().values()) <= beyond:
        app.check_alive()
        assert time.monotonic() < deadline, f"no counts beyond {beyond} words:\n{app.tail()}"
        reader.poll()


def assert_never_regressed(reader: CountsReader) -> None:
    """Each word's committed counts rise strictly, in one partition: an aborted (or zombie)
    Streams transaction leaking into read_committed output would repeat or lower a count."""
    for word, counts in reader.sequences.items():
        assert len(reader.partition_of[word]) == 1, f"{word} in {reader.partition_of[word]}"
        steps = list(itertools.pairwise(counts))
        bad = [(a, b) for a, b in steps if b <= a]
        assert not bad, f"{word}: counts went {bad[:5]} (sequence {counts})"


def test_word_count_exactly_once_through_kills_and_state_loss(
    broker: EmbeddedBroker, make_app: Callable[..., StreamsApp]
) -> None:
    suffix = uuid.uuid4().hex[:8]
    input_topic, output_topic = f"sentences-{suffix}", f"counts-{suffix}"
    create_topics(broker.bootstrap, {input_topic: PARTITIONS, output_topic: PARTITIONS})
    app = make_app(broker.bootstrap, input_topic, output_topic)
    sentences = Input(broker.bootstrap, input_topic)
    reader = CountsReader(broker.bootstrap, output_topic, PARTITIONS)
    try:
        app.start().wait_running(RUNNING_TIMEOUT_S)

        # Streams SIGKILLed while it works through the input (its transaction open or not).
        sentences.write(10)
        wait_progress(reader, app, 0)
        app.kill()
        app.start()

        # The broker SIGKILLed while Streams runs, between the producer's transactions.
        done = sentences.total()
        sentences.write(10)
        wait_progress(reader, app, done)
        broker.kill()
        broker.start(timeout=60)

        # Streams SIGKILLed again, then the rest of the input.
        done = sentences.total()
        sentences.write(10)
        wait_progress(reader, app, done)
        app.kill()
        app.start()
        sentences.write(10)

        wait_exact(reader, sentences.truth, app)
        assert ABORTED_WORD not in reader.latest()
        assert_never_regressed(reader)

        # Stopped cleanly and its state directory wiped: the store is rebuilt from the
        # changelog, and the counts go on from the true totals.
        app.stop()
        shutil.rmtree(app.state_dir)
        app.start()
        sentences.write(4)
        wait_exact(reader, sentences.truth, app)
        assert_never_regressed(reader)
        assert app.starts == 4
        assert sentences.aborted == 11
    finally:
        reader.close()
