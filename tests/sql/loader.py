"""The README's consume-transform-store example: a topic's records, upper-cased, into a table.

python -m tests.sql.loader BOOTSTRAP TOPIC URL
"""

import sys

import sqlalchemy as sa

from onceflow.sql.consumer import DatabaseConsumer

bootstrap, topic, url = sys.argv[1:4]
events = sa.Table(
    "events",
    sa.MetaData(),
    sa.Column("topic", sa.Text),
    sa.Column("partition", sa.Integer),
    sa.Column("offset", sa.BigInteger),
    sa.Column("value", sa.Text),
)


def store(conn: sa.Connection, messages: list) -> None:
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
