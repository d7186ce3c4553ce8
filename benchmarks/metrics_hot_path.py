"""What the metrics add to each request on the broker's hot path, timed in process.

A request through dispatch's timed handler (count, two perf_counter calls, a histogram
observation) against the bare handler, and Produce's per-partition count (record count from
the batch headers, bytes) for one batch. Both with timeit, best of 5.

    python benchmarks/metrics_hot_path.py
"""

from __future__ import annotations

import timeit
from types import SimpleNamespace

from onceflow.broker.dispatch import with_metrics
from onceflow.metrics.counters import BrokerCounters
from onceflow.protocol.api_key import ApiKey
from onceflow.records.builder import build_batch


def main() -> None:
    response = object()
    bare = {ApiKey.PRODUCE: lambda request: response}
    timed = with_metrics(bare, BrokerCounters())
    request = SimpleNamespace(api_version=9)
    n = 200_000
    for name, handlers in (("bare handler", bare), ("timed handler", timed)):
        handle = handlers[ApiKey.PRODUCE]
        best = min(timeit.repeat(lambda h=handle: h(request), number=n, repeat=5))
        print(f"{name}: {best / n * 1e6:.2f} us per request")
    counters = BrokerCounters()
    batch = build_batch([(None, b"x" * 100, (), 0)] * 1000)
    best = min(timeit.repeat(lambda: counters.produced("t", batch), number=n, repeat=5))
    print(f"produced() for one partition's batch: {best / n * 1e6:.2f} us")


if __name__ == "__main__":
    main()
