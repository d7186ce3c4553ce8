"""A quixstreams application with the exactly-once guarantee and a stateful step: per key, the
running count and sum of the input values in State (RocksDB, with a changelog topic), emitted
for every input event to the output topic.

Run by tests/thirdparty/test_quixstreams.py with the interpreter of the third-party venv (the
framework with its own pinned client library, unchanged); it does not import onceflow.
Prints "processed <n>" lines so the test can see it working; runs until it is killed.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from quixstreams import Application, State


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--state-dir", required=True)
    # Simulated work per event, so that a kill lands mid-stream rather than after the end.
    parser.add_argument("--work-ms", type=float, default=0.0)
    args = parser.parse_args()

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        state_dir=args.state_dir,
        commit_interval=0.5,
        loglevel="INFO",
        # A killed instance's group membership and open transaction (its transactional.id is
        # random per process, as quixstreams does) last these long: kept short for the test.
        consumer_extra_config={
            "session.timeout.ms": 2000,
            "heartbeat.interval.ms": 500,
            # Small fetches interleave the input partitions, so a kill is mid-stream in each.
            "max.partition.fetch.bytes": 2048,
        },
        producer_extra_config={"transaction.timeout.ms": 5000},
    )
    source = app.topic(args.input, key_deserializer="str", value_deserializer="json")
    sink = app.topic(args.output, key_serializer="str", value_serializer="json")

    def running_total(value: dict[str, Any], state: State) -> dict[str, Any]:
        if args.work_ms:
            time.sleep(args.work_ms / 1000)
        count = state.get("count", 0) + 1
        total = state.get("sum", 0) + value["v"]
        state.set("count", count)
        state.set("sum", total)
        return {"key": value["key"], "seq": value["seq"], "count": count, "sum": total}

    sdf = app.dataframe(source)
    sdf = sdf.apply(running_total, stateful=True)
    sdf.to_topic(sink)
    app.run()


if __name__ == "__main__":
    main()
