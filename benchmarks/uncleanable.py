"""Issue 19, item 3's recipe: what the compacted logs hold after one topic is given
`delete.retention.ms=9223372036854775807` (with a tombstone) beside another compacted topic and
1,500 offset commits. Run it on two checkouts to compare (PYTHONPATH names the code):

    PYTHONPATH=src:. python benchmarks/uncleanable.py

Prints, for each compacted log, its segments and bytes 15 s after the last commit.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from tests.confluent import create_topic
from tests.hostile.test_uncleanable import (
    COMMITS,
    COMMITTED_TOPIC,
    COMPACTED,
    SETTINGS,
    log_bytes,
    offset_commits,
    produce,
    segment_files,
    updates,
)

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.records.varint import INT64_MAX


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
        offset_commits(broker.bootstrap, COMMITS)
        time.sleep(15)  # a measurement: the cleaner's rounds run meanwhile
        for topic in ("forever", "other", "__consumer_offsets"):
            files = segment_files(data, topic)
            print(f"{topic}: {len(files)} segments, {log_bytes(data, topic)} bytes")


if __name__ == "__main__":
    main()
