"""The bundled pipelines into a database, as the onceflow-sql tests run them: the input, the
true result, and a reader that polls the tables during the run for part of a micro-batch."""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Sequence

import sqlalchemy as sa

WORDS_PER_SENTENCE = 6
TABLES = ("word_counts", "events")


def sentences(start: int, count: int) -> list[str]:
    """Sentences of exactly WORDS_PER_SENTENCE words each, over a small vocabulary."""
    return [
        f"alpha beta {i % 5}x gamma {i % 3}y delta{i % 11}" for i in range(start, start + count)
    ]


def true_counts(written: Sequence[str]) -> dict[str, int]:
    return dict(Counter(w for s in written for w in re.split(r"[^a-z0-9']+", s.lower()) if w))


def database_counts(url: str) -> dict[str, int]:
    engine = sa.create_engine(_driver(url))
    try:
        with engine.connect() as conn:
            return dict(conn.execute(sa.text("SELECT word, count FROM word_counts")).all())
    finally:
        engine.dispose()


def database_events(url: str) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every row of the events table."""
    engine = sa.create_engine(_driver(url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text('SELECT "partition", "offset", value FROM events ORDER BY 1, 2')
            ).all()
            return [(int(p), int(o), bytes(v)) for p, o, v in rows]
    finally:
        engine.dispose()


def check_events(rows: list[tuple[int, int, bytes]], written: Sequence[str]) -> None:
    """Every record once: no gap in any partition's offsets, the values those written."""
    by_partition: dict[int, list[int]] = {}
    for partition, offset, _ in rows:
        by_partition.setdefault(partition, []).append(offset)
    for partition, offsets in by_partition.items():
        assert offsets == list(range(len(offsets))), f"partition {partition}: gaps or repeats"
    assert sorted(v.decode() for _, _, v in rows) == sorted(written)


def _driver(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


# One statement, so one snapshot: the rows and the positions their batches recorded.
_SNAPSHOT = sa.text(
    "SELECT"
    " (SELECT count(*) FROM events),"
    " (SELECT coalesce(sum(next_offset), 0) FROM onceflow_sql_positions"
    "   WHERE pipeline = 'events'),"
    " (SELECT coalesce(sum(count), 0) FROM word_counts),"
    " (SELECT coalesce(sum(next_offset), 0) FROM onceflow_sql_positions"
    "   WHERE pipeline = 'word_counts')"
)


class WholeBatchReader:
    """Polls both tables while pipelines write them: in every snapshot, the events table holds
    exactly the records its positions say were read, and the word counts add up to
    WORDS_PER_SENTENCE per sentence read. Part of a micro-batch visible breaks either."""

    def __init__(self, url: str) -> None:
        self.engine = sa.create_engine(_driver(url), pool_pre_ping=True)
        self.polls = 0
        self.nonempty_polls = 0
        self.violations: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> WholeBatchReader:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                with self.engine.connect() as conn:
                    events, event_positions, words, word_positions = conn.execute(_SNAPSHOT).one()
            except sa.exc.SQLAlchemyError:
                continue  # tables not made yet, or the server restarting
            self.polls += 1
            if events or words:
                self.nonempty_polls += 1
            if events != event_positions:
                self.violations.append(f"{events} events, positions say {event_positions}")
            if words != WORDS_PER_SENTENCE * word_positions:
                self.violations.append(f"{words} words counted for {word_positions} sentences")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.engine.dispose()
