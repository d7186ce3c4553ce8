"""A fixed-bucket histogram cheap enough for every request: one bisect and two additions.

prometheus_client's Histogram takes a lock per observation and a label lookup per call; here
the event loop is the only writer, so plain lists do, and the collector reads them at scrape.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence


class Histogram:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # bucket i holds bounds[i-1] < value <= bounds[i] (Prometheus's `le`)
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, observations <= le), as prometheus_client's HistogramMetricFamily takes them."""
        out: list[tuple[str, int]] = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
        return out
