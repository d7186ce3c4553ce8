"""Figures of a benchmark: phases (records and bytes in a time), median rounds, ratios and
nearest-rank latency percentiles."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MB = 1_000_000


@dataclass
class Phase:
    """One direction of one workload: how many records and bytes moved in how long."""

    records: int
    value_bytes: int
    seconds: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.value_bytes / MB / self.seconds if self.seconds > 0 else 0.0

    def as_json(self) -> dict[str, float]:
        return {
            "records": self.records,
            "value_bytes": self.value_bytes,
            "seconds": round(self.seconds, 4),
            "records_per_s": round(self.records_per_s, 1),
            "mb_per_s": round(self.mb_per_s, 3),
        }


def median_phase(phases: Sequence[Phase]) -> Phase | None:
    """The round with the median rate (the lower middle one for an even count)."""
    if not phases:
        return None
    ordered = sorted(phases, key=lambda phase: phase.records_per_s)
    return ordered[(len(ordered) - 1) // 2]


def medians(rounds: dict[str, list[Phase]]) -> dict[str, Phase]:
    """The median round of each kind that has one."""
    found = {name: median_phase(phases) for name, phases in rounds.items()}
    return {name: phase for name, phase in found.items() if phase is not None}


def rate_ratio(phase: Phase | None, reference: Phase | None) -> float | None:
    """records/s of `phase` over those of `reference` (None without both figures)."""
    if phase is None or reference is None or reference.records_per_s == 0:
        return None
    return phase.records_per_s / reference.records_per_s


@dataclass(frozen=True)
class Latency:
    """Nearest-rank percentiles of call durations, in ms."""

    count: int
    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Latency | None:
        if not samples:
            return None
        ordered = sorted(samples)
        return cls(len(ordered), _rank(ordered, 0.50), _rank(ordered, 0.99), ordered[-1])

    def as_json(self) -> dict[str, float]:
        return {
            "count": self.count,
            "p50": round(self.p50, 3),
            "p99": round(self.p99, 3),
            "max": round(self.max, 3),
        }


def _rank(ordered: Sequence[float], quantile: float) -> float:
    return ordered[max(0, math.ceil(quantile * len(ordered)) - 1)]


@dataclass
class BrokerCost:
    """What one phase of one round cost a broker the benchmark started: its CPU seconds
    (utime + stime of its process) over the phase, the Produce requests the clients sent in
    it, and their round-trip windows as (requests, p50 us, p99 us)."""

    records: int
    cpu_s: float | None
    produce_requests: int = 0
    rtt_windows: list[tuple[int, float, float]] | None = None

    @property
    def cpu_us_per_record(self) -> float | None:
        if self.cpu_s is None or self.records <= 0:
            return None
        return self.cpu_s * 1e6 / self.records

    @property
    def cpu_us_per_request(self) -> float | None:
        if self.cpu_s is None or self.produce_requests <= 0:
            return None
        return self.cpu_s * 1e6 / self.produce_requests

    def as_json(self) -> dict[str, object]:
        return {
            "records": self.records,
            "cpu_s": None if self.cpu_s is None else round(self.cpu_s, 3),
            "produce_requests": self.produce_requests,
            "rtt_windows": [list(w) for w in self.rtt_windows or []],
        }


def median_of(values: Sequence[float | None]) -> float | None:
    """The median of the figures there are (None when there is none)."""
    present = sorted(v for v in values if v is not None)
    return present[(len(present) - 1) // 2] if present else None


@dataclass(frozen=True)
class CostSummary:
    """A target's costs over its rounds: medians of each round's figure; the round trips'
    p50 and p99 are those of the median 1-second window over every round."""

    cpu_us_per_request: float | None
    cpu_us_per_record: float | None
    requests: float | None
    rtt_p50_ms: float | None
    rtt_p99_ms: float | None

    @classmethod
    def of(cls, rounds: Sequence[BrokerCost]) -> CostSummary:
        windows = [w for cost in rounds for w in cost.rtt_windows or []]
        p50 = median_of([w[1] for w in windows])
        p99 = median_of([w[2] for w in windows])
        return cls(
            median_of([c.cpu_us_per_request for c in rounds]),
            median_of([c.cpu_us_per_record for c in rounds]),
            median_of([float(c.produce_requests) for c in rounds if c.produce_requests]),
            None if p50 is None else p50 / 1000,
            None if p99 is None else p99 / 1000,
        )

    def as_json(self) -> dict[str, float | None]:
        return {
            name: None if value is None else round(value, 3)
            for name, value in (
                ("cpu_us_per_produce_request", self.cpu_us_per_request),
                ("cpu_us_per_record", self.cpu_us_per_record),
                ("produce_requests", self.requests),
                ("ack_rtt_p50_ms", self.rtt_p50_ms),
                ("ack_rtt_p99_ms", self.rtt_p99_ms),
            )
        }
