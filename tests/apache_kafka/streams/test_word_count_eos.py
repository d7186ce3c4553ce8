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
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from onceflow.apache_kafka import Distribution
from onceflow.broker.embedded import EmbeddedBroker
from tests.apache_kafka.exactly_once import TXN_TIMEOUT_S, transactional_producer
from tests.apache_kafka.streams.word_count import CountsReader, StreamsApp
from tests.confluent import QUIET, create_topics
from tests.waiting import wait_for

PARTITIONS = 2
VOCABULARY = tuple(f"word{i}" for i in range(30))
# Only aborted transactions hold it: a count of it is a read of aborted input.
ABORTED_WORD = "aborted"
SENTENCES_PER_TXN = 4
# Between the writer's transactions: about two a second.
WRITE_PAUSE_S = 0.4
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
        # Read by the test thread while the writer thread counts: one int, no dict iteration.
        self.committed_words = 0

    def total(self) -> int:
        return self.committed_words

    def write(self, transactions: int = 1) -> None:
        """`transactions` transactions of sentences; every fourth aborted on purpose."""
        for _ in range(transactions):
            self.transactions += 1
            commit = self.transactions % 4 != 0
            sentences = [
                [self.random.choice(VOCABULARY) for _ in range(WORDS_PER_SENTENCE)]
                + ([] if commit else [ABORTED_WORD])
                for _ in range(SENTENCES_PER_TXN)
            ]
            self.producer.begin_transaction()
            for i, words in enumerate(sentences):
                self.producer.produce(
                    self.topic, " ".join(words).encode(), partition=i % PARTITIONS
                )
                self.producer.poll(0)
            if commit and self.committed():
                for words in sentences:
                    self.truth.update(words)
                self.committed_words += sum(map(len, sentences))
                continue
            if not commit:
                # Written first: librdkafka drops what it has not sent when it aborts.
                self.delivered()
            self.retrying(lambda: self.producer.abort_transaction(TXN_TIMEOUT_S))
            self.aborted += 1

    def committed(self) -> bool:
        """Commit; False when librdkafka says the transaction must be aborted instead."""
        try:
            self.retrying(lambda: self.producer.commit_transaction(TXN_TIMEOUT_S))
            return True
        except KafkaException as e:
            if not e.args[0].txn_requires_abort():
                raise
            return False

    @staticmethod
    def retrying(end: Callable[[], None]) -> None:
        """Commit or abort again while librdkafka says the error is retriable (its docs ask
        so); any other error fails the test."""
        deadline = time.monotonic() + TXN_TIMEOUT_S * 2
        while True:
            try:
                end()
                return
            except KafkaException as e:
                if not e.args[0].retriable() or time.monotonic() >= deadline:
                    raise

    def delivered(self) -> None:
        left = self.producer.flush(TXN_TIMEOUT_S)
        assert left == 0, f"{left} records of an aborted transaction not delivered"


class Writer(threading.Thread):
    """Writes transactions one after another, paced, while the faults happen; `pause()`
    returns once it is between transactions and holds it there until `resume()`."""

    def __init__(self, sentences: Input) -> None:
        super().__init__(daemon=True)
        self.sentences = sentences
        self.allowed = threading.Event()
        self.allowed.set()
        self.idle = threading.Event()
        self.done = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.done.is_set():
                if not self.allowed.is_set():
                    self.idle.set()
                    self.allowed.wait()
                    self.idle.clear()
                    continue
                self.sentences.write()
                # Pacing, not waiting: input keeps arriving through each fault.
                self.done.wait(WRITE_PAUSE_S)
        except BaseException as e:  # reported by the test thread
            self.failure = e
        finally:
            self.idle.set()

    def pause(self) -> None:
        self.allowed.clear()
        self.check()
        assert self.idle.wait(TXN_TIMEOUT_S * 2), "the writer did not finish its transaction"
        self.check()

    def resume(self) -> None:
        self.allowed.set()

    def stop(self) -> None:
        self.done.set()
        self.allowed.set()
        self.join(TXN_TIMEOUT_S * 2)
        assert not self.is_alive(), "the writer did not stop"
        self.check()

    def check(self) -> None:
        if self.failure is not None:
            raise AssertionError(f"the writer failed: {self.failure!r}") from self.failure


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

    def make(
        bootstrap: str,
        input_topic: str,
        output_topic: str,
        *,
        application_id: str | None = None,
        name: str = "app",
        **settings: str,
    ) -> StreamsApp:
        workdir = tmp_path / name
        workdir.mkdir()
        properties = {
            "bootstrap.servers": bootstrap,
            "application.id": application_id or f"word-count-{uuid.uuid4().hex[:8]}",
            "state.dir": str(workdir / "state"),
            # Transactions open half a second: a SIGKILL finds one open with records in it.
            "commit.interval.ms": "500",
            # Purge the repartition topic often (DeleteRecords), not every 30 s.
            "repartition.purge.interval.ms": "1000",
            # A killed instance's member leaves the group in 10 s, not the default 45 s.
            "session.timeout.ms": "10000",
            "heartbeat.interval.ms": "1000",
            **settings,
        }
        app = StreamsApp(
            apache_kafka, word_count_classes, properties, workdir, input_topic, output_topic
        )
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.kill()


def wait_exact(reader: CountsReader, truth: Counter[str], *apps: StreamsApp) -> None:
    """Until the latest committed count of every word is its true count (the input written);
    at once a failure when a count is beyond it, as counts never go down."""
    deadline = time.monotonic() + EXACT_TIMEOUT_S
    while (latest := reader.latest()) != dict(truth):
        for app in apps:
            app.check_alive()
        wrong = {
            w: (latest.get(w), truth.get(w))
            for w in sorted({*latest, *truth})
            if latest.get(w) != truth.get(w)
        }
        beyond = any(count > truth.get(w, 0) for w, count in latest.items())
        if beyond or time.monotonic() >= deadline:
            raise AssertionError(
                f"counts not exact ({'beyond the truth' if beyond else f'{EXACT_TIMEOUT_S} s'}):"
                f" (output, truth) {wrong}\n" + "\n".join(app.tail() for app in apps)
            )
        reader.poll()


def wait_progress(reader: CountsReader, app: StreamsApp, writer: Writer, beyond: int) -> None:
    """Until Streams has committed counts of more than `beyond` words in all: it is working
    through the input the writer goes on writing."""
    deadline = time.monotonic() + RUNNING_TIMEOUT_S
    while sum(reader.latest().values()) <= beyond:
        app.check_alive()
        writer.check()
        assert time.monotonic() < deadline, f"no counts beyond {beyond} words:\n{app.tail()}"
        reader.poll()


def purged(bootstrap: str, topic: str) -> bool:
    """Every partition's log start offset is past 0."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "purged", **QUIET})
    try:
        return all(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0] > 0
            for p in range(PARTITIONS)
        )
    finally:
        consumer.close()


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
    """Streams SIGKILLed twice and the broker once while the input flows: exact counts, none
    repeated; then a wiped state directory, restored from the changelog, goes on exactly."""
    suffix = uuid.uuid4().hex[:8]
    input_topic, output_topic = f"sentences-{suffix}", f"counts-{suffix}"
    create_topics(broker.bootstrap, {input_topic: PARTITIONS, output_topic: PARTITIONS})
    app = make_app(broker.bootstrap, input_topic, output_topic)
    sentences = Input(broker.bootstrap, input_topic)
    reader = CountsReader(broker.bootstrap, output_topic, PARTITIONS)
    writer = Writer(sentences)
    try:
        app.start().wait_running(RUNNING_TIMEOUT_S)
        writer.start()

        # Streams SIGKILLed while it works through the input (its transaction open or not).
        wait_progress(reader, app, writer, 0)
        app.kill()
        app.start()

        # The broker SIGKILLed while Streams runs, between the producer's transactions (a
        # librdkafka producer fails fatally when its coordinator dies mid-commit).
        wait_progress(reader, app, writer, sentences.total())
        writer.pause()
        broker.kill()
        broker.start(timeout=60)
        writer.resume()

        # Streams SIGKILLed again, then the input ends.
        wait_progress(reader, app, writer, sentences.total())
        app.kill()
        app.start()
        wait_progress(reader, app, writer, sentences.total())
        writer.stop()

        wait_exact(reader, sentences.truth, app)
        assert ABORTED_WORD not in reader.latest()
        assert sentences.aborted > 0
        assert_never_regressed(reader)
        # Streams deletes what it has consumed of its repartition topic (DeleteRecords, every
        # repartition.purge.interval.ms).
        wait_for(
            lambda: purged(broker.bootstrap, app.repartition_topic("words")),
            RUNNING_TIMEOUT_S,
            "Streams to purge its repartition topic",
        )

        # Stopped cleanly and its state directory wiped: the store is rebuilt from the
        # changelog, and the counts go on from the true totals.
        app.stop()
        shutil.rmtree(app.state_dir)
        app.start()
        sentences.write(4)
        wait_exact(reader, sentences.truth, app)
        assert_never_regressed(reader)
        assert app.starts == 4
    finally:
        writer.done.set()
        writer.allowed.set()
        reader.close()


def test_word_count_zombie_fenced_by_its_group_membership(
    broker: EmbeddedBroker, make_app: Callable[..., StreamsApp]
) -> None:
    """exactly_once_v2 fences a zombie by its consumer group metadata (KIP-447), not by a
    transactional id per task: two instances share the tasks; one is SIGSTOPped, its
    transaction open, until the group has given its tasks to the other, then woken. Its
    transaction must not commit (its TxnOffsetCommit names a member the group expelled): the
    counts stay exact and no count repeats."""
    suffix = uuid.uuid4().hex[:8]
    input_topic, output_topic = f"sentences-{suffix}", f"counts-{suffix}"
    create_topics(broker.bootstrap, {input_topic: PARTITIONS, output_topic: PARTITIONS})
    application_id = f"word-count-{suffix}"
    settings = {
        # Longer than the pause: the group, not the transaction timeout, must fence the zombie.
        "transaction.timeout.ms": "120000",
        "session.timeout.ms": "6000",  # the broker's group.min.session.timeout.ms
    }
    zombie, survivor = (
        make_app(
            broker.bootstrap,
            input_topic,
            output_topic,
            application_id=application_id,
            name=name,
            **settings,
        )
        for name in ("zombie", "survivor")
    )
    sentences = Input(broker.bootstrap, input_topic)
    reader = CountsReader(broker.bootstrap, output_topic, PARTITIONS)
    writer = Writer(sentences)
    try:
        zombie.start()
        survivor.start()
        zombie.wait_running(RUNNING_TIMEOUT_S)
        survivor.wait_running(RUNNING_TIMEOUT_S)
        writer.start()
        wait_progress(reader, survivor, writer, 0)
        wait_progress(reader, survivor, writer, sentences.total())

        mark = len(survivor.states)
        zombie.pause()
        # The group expels the frozen member after its session timeout and rebalances.
        wait_for(
            lambda: "REBALANCING" in survivor.states[mark:] and survivor.states[-1] == "RUNNING",
            RUNNING_TIMEOUT_S,
            lambda: f"the survivor to take the zombie's tasks:\n{survivor.tail()}",
        )
        zombie.resume()
        wait_progress(reader, survivor, writer, sentences.total())
        writer.stop()

        wait_exact(reader, sentences.truth, zombie, survivor)
        assert ABORTED_WORD not in reader.latest()
        assert_never_regressed(reader)
    finally:
        writer.done.set()
        writer.allowed.set()
        reader.close()
