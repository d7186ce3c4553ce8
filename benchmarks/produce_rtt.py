"""Produce throughput next to the request latency librdkafka sees, for brokers compared in one run.

`onceflow bench` gives records/s; this gives, beside them, what the producers' librdkafka
reports in its statistics: the produce round trip (rtt) and how many records a request
carried. At 100 B the producers' own CPU and the broker's acknowledgement latency (with
fsync: the group commit) decide the figure, so the rtt says why two brokers differ.

    python benchmarks/produce_rtt.py fsync=127.0.0.1:39501 memory=127.0.0.1:39502 \
        [--producers 2] [--records 500000] [--value-size 100] [--rounds 5]

Targets are started by hand (`onceflow broker --data-dir D --listen HOST:PORT`, any Kafka
broker works); rounds alternate between them and the median round is shown. The producers use
`onceflow bench`'s settings (acks=all, idempotence, linger.ms=5).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
import uuid
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.bench.producers import PRODUCER_SETTINGS


def produce(bootstrap: str, topic: str, args: argparse.Namespace, out: Any, go: Any) -> None:
    """One producer process: warm up, wait for `go`, produce, report times and statistics."""
    delivered = [0]
    stats: list[str] = []
    producer = Producer(
        {
            **PRODUCER_SETTINGS,
            "bootstrap.servers": bootstrap,
            "on_delivery": lambda error, _m: delivered.__setitem__(0, delivered[0] + 1),
            "statistics.interval.ms": 100,
            "stats_cb": stats.append,
        }
    )
    producer.produce(topic, b"")
    producer.flush(30)
    delivered[0] = 0
    payload = os.urandom(args.value_size)
    go.wait()
    stats.clear()
    started = time.monotonic()
    for i in range(args.records):
        while True:
            try:
                producer.produce(topic, payload)
                break
            except BufferError:
                producer.poll(0.005)
        if i & 1023 == 0:
            producer.poll(0)
    producer.flush(120)
    finished = time.monotonic()
    producer.poll(0.3)  # the statistics of the last window
    # rtt is a histogram per statistics window: weigh each window's mean by its count
    rtts, requests = [], 0
    for window in map(json.loads, stats):
        broker = next(b for b in window["brokers"].values() if b["nodeid"] >= 0)
        rtts.append((broker["rtt"]["avg"] / 1000, broker["rtt"]["cnt"]))
        requests = broker["req"]["Produce"]
    counted = sum(count for _, count in rtts) or 1
    rtt_ms = sum(mean * count for mean, count in rtts) / counted
    out.put((started, finished, delivered[0], requests, rtt_ms))


def one_round(bootstrap: str, args: argparse.Namespace) -> tuple[float, float, float]:
    """(records/s, librdkafka rtt ms, records per request) of one round."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"rtt-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(30)
    out: Any = multiprocessing.Queue()
    go = multiprocessing.Event()
    workers = [
        multiprocessing.Process(target=produce, args=(bootstrap, topic, args, out, go))
        for _ in range(args.producers)
    ]
    for worker in workers:
        worker.start()
    time.sleep(2)  # connected and warmed up
    go.set()
    reports = [out.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join()
    total = sum(r[2] for r in reports)
    if total != args.records * args.producers:
        raise SystemExit(f"{bootstrap}: {total} of {args.records * args.producers} delivered")
    elapsed = max(r[1] for r in reports) - min(r[0] for r in reports)
    requests = sum(r[3] for r in reports)
    return total / elapsed, statistics.mean(r[4] for r in reports), total / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="+", metavar="NAME=HOST:PORT")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--records", type=int, default=500_000, help="per producer")
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    targets = [t.split("=", 1) for t in args.targets]
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in targets}
    for number in range(1, args.rounds + 1):
        for name, bootstrap in targets:
            rate, rtt, per_request = one_round(bootstrap, args)
            results[name].append((rate, rtt, per_request))
            print(f"round {number} {name}: {rate:,.0f} rec/s, rtt {rtt:.2f} ms", flush=True)
    first = statistics.median(r[0] for r in results[targets[0][0]])
    print(
        f"\n{args.producers} producers x {args.records:,} records of {args.value_size} B, "
        f"median of {args.rounds} rounds:"
    )
    for name, rounds in results.items():
        rate = statistics.median(r[0] for r in rounds)
        rtt = statistics.median(r[1] for r in rounds)
        per_request = statistics.median(r[2] for r in rounds)
        print(
            f"{name:>12}: {rate:>12,.0f} rec/s  rtt {rtt:6.2f} ms  "
            f"{per_request:>7,.0f} records/request  {rate / first:.2f}x of {targets[0][0]}"
        )


if __name__ == "__main__":
    main()
