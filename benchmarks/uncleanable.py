"""Issue 19, item 3's recipe: what the compacted logs hold after one topic is given
`delete.retention.ms=9223372036854775807` (with a tombstone) beside another compacted topic and
1,500 offset commits. Run it on two checkouts to compare (PYTHONPATH names the code):

    PYTHONPATH=src python benchmarks/uncleanable.py

Prints, for each compacted log, its segments and bytes 15 s after the last commit.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from _support import commit_each, create_topic
from confluent_kafka import KafkaError, Producer

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.log.segment import LOG_SUFFIX
from onceflow.records.varint import INT64_MAX

# the recipe of tests/hostile/test_uncleanable.py
SETTINGS = {
    "offsets.topic.segment.bytes": "4096",
    "log.cleaner.backoff.ms": "50",
    "log.cleaner.min.cleanable.ratio": "0.01",
}
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.bytes": "1024",
    "min.cleanable.dirty.ratio": "0.01",
}
COMMITTED_TOPIC = "committed"
GROUPS = ("g1", "g2")
COMMITS = 1_500  # OffsetCommit requests, as in the figures


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]]) -> None:
    """One batch per record (linger 0, acks=all): many small segments to clean."""
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    for key, value in records:
        producer.produce(
            topic, key=key, value=value, on_delivery=lambda e, _m: e and errors.append(e)
        )
        producer.flush(30)
    if errors:
        raise RuntimeError(f"produce failed: {errors}")


def updates(keys: int, rounds: int) -> list[tuple[bytes, bytes | None]]:
    return [(b"k%d" % k, b"v%d" % r) for r in range(rounds) for k in range(keys)]


def segment_files(data: Path, topic: str, partition: int = 0) -> list[Path]:
    return sorted((data / f"{topic}-{partition}").glob(f"*{LOG_SUFFIX}"))


def log_bytes(data: Path, topic: str, partition: int = 0) -> int:
    return sum(p.stat().st_size for p in segment_files(data, topic, partition))


def main() -> None:
    data = Path(tempfile.mkdtemp(prefix="uncleanable-")) / "data"
    with EmbeddedBroker(data, settings=SETTINGS, fsync=False) as broker:
        retention = {"delete.retention.ms": str(INT64_MAX)}
        create_topic(broker.bootstrap, "forever", **COMPACTED, **retention)
        create_topic(broker.bootstrap, "other", **COMPACTED)
        create_topic(broker.bootstrap, COMMITTED_TOPIC, 2)
        tombstone: list[tuple[bytes, bytes | None]] = [(b"gone", b"1"), (b"gone", None)]
        produce(broker.bootstrap, "forever", [*tombstone, *updates(10, 10)])
        produce(broker.bootstrap, "other", updates(10, 10))
        commit_each(broker.bootstrap, COMMITTED_TOPIC, GROUPS, COMMITS)
        time.sleep(15)  # a measurement: the cleaner's rounds run meanwhile
        for topic in ("forever", "other", "__consumer_offsets"):
            files = segment_files(data, topic)
            print(f"{topic}: {len(files)} segments, {log_bytes(data, topic)} bytes")


if __name__ == "__main__":
    main()
