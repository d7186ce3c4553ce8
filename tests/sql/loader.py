"""The README's consume-transform-store example: a topic's records, upper-cased, into a table.

python -m tests.sql.loader BOOTSTRAP TOPIC URL [SECONDS]

SECONDS (a test's): how long each batch's transaction stays open before its rows go in, so that
a kill -9 lands while the loader still has input to store.
"""

import sys
import time

import sqlalchemy as sa

from onceflow.sql.consumer import DatabaseConsumer

bootstrap, topic, url = sys.argv[1:4]
pause_s = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
events = sa.Table(
    "events",
    sa.MetaData(),
    sa.Column("topic", sa.Text),
    sa.Column("partition", sa.Integer),
    sa.Column("offset", sa.BigInteger),
    sa.Column("value", sa.Text),
)


def store(conn: sa.Connection, messages: list) -> None:
    time.sleep(pause_s)
    rows = [
        {
            "topic": m.topic(),
            "partition": m.partition(),
            "offset": m.offset(),
            "value": m.value().decode().upper(),
        }
        for m in messages
    ]
    conn.execute(events.insert(), rows)


loader = DatabaseConsumer(
    {"bootstrap.servers": bootstrap, "group.id": "loader"},
    url,
    pipeline="loader",
    topics=[topic],
)
with loader.engine.begin() as conn:
    events.create(conn, checkfirst=True)
loader.run(store, max_messages=50)
