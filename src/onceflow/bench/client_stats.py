"""What a producer's client saw of the broker, from librdkafka's statistics: how many Produce
requests it sent and their round trips (request sent to response read), window by window.

librdkafka keeps the round-trip times of each broker connection in a histogram that it
empties at every statistics emission, so each emission gives the percentiles of one window of
`statistics.interval.ms`; the benchmark reports the median window (stats.CostSummary).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

STATS_INTERVAL_MS = 1000
# librdkafka's placeholder entries for the bootstrap addresses have node id -1.
BOOTSTRAP_NODE_ID = -1

# One window: (requests answered in it, p50 us, p99 us).
RttWindow = tuple[int, float, float]


class ClientStats:
    """Collects librdkafka's statistics of one client (its `stats_cb`)."""

    def __init__(self) -> None:
        self.emissions = 0
        self.produce_requests = 0
        self.windows: list[RttWindow] = []
        self._recording = False

    def settings(self) -> dict[str, Any]:
        """The client settings that make librdkafka call back with its statistics."""
        return {"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": self.on_stats}

    def start(self) -> None:
        """Windows count from here on (those of connecting and warming up are left out)."""
        self._recording = True

    def on_stats(self, text: str) -> None:
        self.emissions += 1
        brokers = [
            b for b in json.loads(text).get("brokers", {}).values()
            if b.get("nodeid", BOOTSTRAP_NODE_ID) != BOOTSTRAP_NODE_ID
        ]  # fmt: skip
        self.produce_requests = sum(int(b.get("req", {}).get("Produce", 0)) for b in brokers)
        if not self._recording:
            return
        for broker in brokers:
            rtt = broker.get("rtt", {})
            if rtt.get("cnt", 0) > 0:
                self.windows.append((int(rtt["cnt"]), float(rtt["p50"]), float(rtt["p99"])))

    def final(self, poll: Callable[[float], object], timeout_s: float = 3.0) -> None:
        """Serve callbacks until one more emission: it counts every request answered so far."""
        seen = self.emissions
        deadline = time.monotonic() + timeout_s
        while self.emissions == seen and time.monotonic() < deadline:
            poll(0.05)
