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
