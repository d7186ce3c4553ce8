"""The consume-transform-store helper (onceflow.sql.consumer) when a database transaction
fails and the application goes on polling: the batch the database did not take is consumed
again, so every record is stored exactly once."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import sqlalchemy as sa
from confluent_kafka import Message

from onceflow.sql.consumer import DatabaseConsumer
from tests.spark.kafka_io import create_topic, produce

RECORDS = 300


class DatabaseWentAway(RuntimeError):
    """Raised by the store on purpose, as a lost connection or a refused commit would be."""


def test_a_failed_store_is_consumed_again(bootstrap: str, topic_name: str, tmp_path: Path) -> None:
    create_topic(bootstrap, topic_name, 2)
    values = [f"v{i}" for i in range(RECORDS)]
    produce(bootstrap, topic_name, values)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    rows = sa.Table(
        "rows", sa.MetaData(), sa.Column("value", sa.Text), sa.Column("offset", sa.BigInteger)
    )
    loader = DatabaseConsumer(
        {"bootstrap.servers": bootstrap, "group.id": f"{topic_name}-loader"},
        url,
        pipeline="errors",
        topics=[topic_name],
    )
    with loader.engine.begin() as conn:
        rows.create(conn)
    failures = 0

    def store(conn: sa.Connection, messages: list[Message]) -> None:
        nonlocal failures
        conn.execute(
            rows.insert(), [{"value": m.value().decode(), "offset": m.offset()} for m in messages]
        )
        if failures < 3:  # the rows above are rolled back with the transaction
            failures += 1
            raise DatabaseWentAway("the database went away mid-batch")

    def stored() -> list[str]:
        with loader.engine.connect() as conn:
            return [v for (v,) in conn.execute(sa.select(rows.c.value))]

    deadline = time.monotonic() + 120
    try:
        while len(stored()) < RECORDS and time.monotonic() < deadline:
            # an application that logs the error and goes on
            with contextlib.suppress(DatabaseWentAway):
                loader.poll_batch(store, max_messages=20)
    finally:
        loader.consumer.close()
    assert failures == 3
    found = stored()
    assert sorted(found) == sorted(values), (
        f"{len(found)} rows for {RECORDS} records, {len(set(values) - set(found))} missing, "
        f"{len(found) - len(set(found))} twice"
    )
