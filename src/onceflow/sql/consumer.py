"""Consume-transform-store for applications without Spark: a confluent-kafka consumer whose
positions live in the database, written in the same transaction as the rows.

    loader = DatabaseConsumer(
        {"bootstrap.servers": "localhost:9092", "group.id": "loader"},
        "sqlite:///events.db", pipeline="loader", topics=["events"],
    )
    loader.run(store)   # store(conn, messages): insert rows on conn, inside the transaction

On assignment the consumer seeks to the database's positions (Kafka's committed offsets are
never used: the database is the truth). Each polled batch is stored and its positions written
in one database transaction; a position only moves forward from where the batch starts, so a
consumer that lost its partitions in a rebalance (a zombie) cannot store them twice: its
transaction is rolled back and it seeks again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message
from sqlalchemy.engine import Connection

from onceflow.sql.engine import engine_for
from onceflow.sql.positions import dialect_insert, positions_table, read_positions

log = logging.getLogger(__name__)

Store = Callable[[Connection, list[Message]], None]


class StalePositionError(RuntimeError):
    """The database's position is past what this batch starts at: another consumer stored it."""


class DatabaseConsumer:
    def __init__(
        self,
        config: dict[str, object],
        url: str,
        *,
        pipeline: str,
        topics: Sequence[str],
    ) -> None:
        if "group.id" not in config:
            raise ValueError("config needs a group.id (partitions are assigned by the group)")
        self.url = url
        self.pipeline = pipeline
        self.engine = engine_for(url)
        self.table = positions_table(sa.MetaData())
        with self.engine.begin() as conn:
            self.table.create(conn, checkfirst=True)
        self.consumer = Consumer(
            {
                "isolation.level": "read_committed",
                **config,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
            }
        )
        self.consumer.subscribe(list(topics), on_assign=self._on_assign)
        # The consumer is past a batch the database did not take: seek back before polling.
        self._behind = False

    def _on_assign(self, consumer: Consumer, partitions: list) -> None:
        positions = read_positions(self.url, self.pipeline)
        for tp in partitions:
            tp.offset = positions.get((tp.topic, tp.partition), OFFSET_BEGINNING)
        consumer.assign(partitions)

    def _seek_to_database(self) -> None:
        self._on_assign(self.consumer, self.consumer.assignment())

    def poll_batch(self, store: Store, max_messages: int = 500, timeout_s: float = 1.0) -> int:
        """One poll: the messages stored and their positions written in one transaction.
        Returns the number of messages stored.

        A batch the database did not take (the store raised, the commit failed) is consumed
        again: the next poll first seeks to the database's positions, so a caller that goes on
        after the exception loses nothing. Only fatal consumer errors are raised; the others
        (a broker gone, a timeout) librdkafka recovers from by itself, and the messages
        consumed with them are stored."""
        if self._behind:
            self._seek_to_database()
            self._behind = False
        messages = []
        for message in self.consumer.consume(max_messages, timeout_s):
            error = message.error()
            if error is None:
                messages.append(message)
            elif error.fatal():
                raise KafkaException(error)
            elif error.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error (retried by the client): %s", error)
        if not messages:
            return 0
        spans: dict[tuple[str, int], list[int]] = {}
        for m in messages:
            span = spans.setdefault((m.topic(), m.partition()), [m.offset(), m.offset()])
            span[1] = m.offset()
        try:
            with self.engine.begin() as conn:
                for (topic, partition), (first, last) in spans.items():
                    self._advance(conn, topic, partition, first, last + 1)
                store(conn, messages)
        except StalePositionError as exc:
            log.warning("%s: seeking to the database's positions", exc)
            self._seek_to_database()
            return 0
        except BaseException:
            self._behind = True
            raise
        return len(messages)

    def _advance(self, conn: Connection, topic: str, partition: int, first: int, end: int) -> None:
        """Move the position to `end`, only from at most `first` (taking the row's lock)."""
        t = self.table
        insert = dialect_insert(conn)(t).values(
            pipeline=self.pipeline, topic=topic, partition=partition, next_offset=end
        )
        moved = conn.execute(
            insert.on_conflict_do_update(
                index_elements=["pipeline", "topic", "partition"],
                set_={"next_offset": insert.excluded.next_offset},
                where=t.c.next_offset <= first,
            ).returning(t.c.next_offset)
        ).first()
        if moved is None:
            raise StalePositionError(f"{topic}/{partition} is past offset {first}")

    def run(
        self,
        store: Store,
        *,
        until: Callable[[], bool] | None = None,
        max_messages: int = 500,
    ) -> None:
        """Poll and store until `until()` is true (forever without it); closes the consumer."""
        try:
            while until is None or not until():
                self.poll_batch(store, max_messages)
        finally:
            self.close()

    def close(self) -> None:
        """Leave the group (the positions are in the database: nothing to commit)."""
        self.consumer.close()
