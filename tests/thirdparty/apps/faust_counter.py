"""A faust-streaming application with processing_guarantee="exactly_once" and a table: per key,
the running count and sum of the input values (the table's changelog topic holds them), emitted
for every input event to the output topic.

Run by tests/thirdparty/test_faust.py with the interpreter of the third-party venv (the
framework with its own pinned dependencies, unchanged); it does not import onceflow.
Runs until it is killed.
"""

from __future__ import annotations

import argparse
import asyncio

import faust


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--app-id", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--store", default="memory://")
    parser.add_argument("--commit-interval", type=float, default=0.5)
    # Simulated work per event, so that a kill lands mid-stream rather than after the end.
    parser.add_argument("--work-ms", type=float, default=0.0)
    args = parser.parse_args()

    app = faust.App(
        args.app_id,
        broker=f"kafka://{args.bootstrap}",
        processing_guarantee="exactly_once",
        store=args.store,
        datadir=args.data_dir,
        topic_partitions=args.partitions,
        broker_commit_interval=args.commit_interval,
        # A killed instance's group membership lasts this long: Kafka's least (group.min.
        # session.timeout.ms). With 2 s, a live instance starved of CPU on a loaded machine
        # missed its heartbeats mid-recovery, and faust 0.15.3 restores its table as empty after
        # such a rebalance (its second recovery never asks for the changelog's end).
        broker_session_timeout=6.0,
        broker_heartbeat_interval=0.5,
        # Small fetches interleave the input partitions, so a kill is mid-stream in each.
        consumer_max_fetch_size=2048,
        web_enabled=False,
    )
    source = app.topic(args.input, key_serializer="raw", value_serializer="json")
    sink = app.topic(args.output, key_serializer="raw", value_serializer="json")
    totals = app.Table("totals", default=None, partitions=args.partitions)

    @app.agent(source)
    async def running_total(stream: faust.StreamT) -> None:
        async for value in stream:
            if args.work_ms:
                await asyncio.sleep(args.work_ms / 1000)
            key = value["key"]
            count, total = totals.get(key) or (0, 0)
            count, total = count + 1, total + value["v"]
            totals[key] = (count, total)
            out = {"key": key, "seq": value["seq"], "count": count, "sum": total}
            await sink.send(key=key.encode(), value=out)

    faust.Worker(app, loglevel="INFO").execute_from_commandline()


if __name__ == "__main__":
    main()
