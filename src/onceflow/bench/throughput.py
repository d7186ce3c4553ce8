"""`onceflow bench`'s figures and settings: every round of each target and value size."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from onceflow.bench.stats import MB, BrokerCost, CostSummary, Phase, median_phase, rate_ratio
from onceflow.bench.targets import (
    TargetSpec,
    onceflow_launcher,
    parse_target,
    tansu_binary,
    tansu_launcher,
)
from onceflow.bench.workload import shape_checks
from onceflow.tools.errors import UsageError
from onceflow.tools.option_values import require_at_least

DEFAULT_VALUE_SIZES = (100, 1024)
DEFAULT_RECORDS = {100: 1_000_000, 1024: 200_000}
DEFAULT_ROUNDS = 3


@dataclass
class Measurement:
    """Every round of one target and value size; the table shows the median round."""

    target: str
    value_size: int
    records: int
    produce_rounds: list[Phase] = field(default_factory=list)
    consume_rounds: list[Phase] = field(default_factory=list)
    # A started broker's RSS during each round's workload: (maximum, at the end); None for
    # a broker the benchmark did not start.
    rss_rounds: list[tuple[int | None, int | None]] = field(default_factory=list)
    # What each round's produce and consume phases cost the broker (CPU: a started broker's).
    produce_costs: list[BrokerCost] = field(default_factory=list)
    consume_costs: list[BrokerCost] = field(default_factory=list)
    error: str | None = None

    @property
    def produce_cost(self) -> CostSummary:
        return CostSummary.of(self.produce_costs)

    @property
    def consume_cost(self) -> CostSummary:
        return CostSummary.of(self.consume_costs)

    @property
    def produce(self) -> Phase | None:
        return median_phase(self.produce_rounds)

    @property
    def consume(self) -> Phase | None:
        return median_phase(self.consume_rounds)

    @property
    def rss_max(self) -> int | None:
        """The highest RSS seen during any round's workload."""
        values = [peak for peak, _ in self.rss_rounds if peak is not None]
        return max(values) if values else None

    @property
    def rss_end(self) -> int | None:
        """RSS at the end of the last round's workload."""
        return self.rss_rounds[-1][1] if self.rss_rounds else None


@dataclass
class IdleMeasurement:
    target: str
    partitions: int
    rss_empty: int | None
    rss_idle: int | None


@dataclass
class BenchSettings:
    value_sizes: list[int]
    records: dict[int, int]
    producers: int
    partitions: int
    replication_factor: int
    idle_partitions: int
    rounds: int = DEFAULT_ROUNDS
    # Untimed rounds before the measured ones (figures dropped), every target alike.
    warm_up_rounds: int = 0
    producer_settings: dict[str, Any] = field(default_factory=dict)
    consumer_settings: dict[str, Any] = field(default_factory=dict)


Ratios = tuple[float | None, float | None]


def ratios(measurements: list[Measurement], baseline: str) -> dict[tuple[str, int], Ratios]:
    """(produce ratio, consume ratio) per (target, value size) against the baseline target."""
    base = {m.value_size: m for m in measurements if m.target == baseline}
    found: dict[tuple[str, int], Ratios] = {}
    for m in measurements:
        ref = base.get(m.value_size)
        found[(m.target, m.value_size)] = (
            rate_ratio(m.produce, ref.produce if ref else None),
            rate_ratio(m.consume, ref.consume if ref else None),
        )
    return found


def bench_settings(
    value_sizes: list[int] | None,
    records: int | None,
    producers: int,
    partitions: int,
    replication_factor: int,
    idle_partitions: int,
    rounds: int = DEFAULT_ROUNDS,
) -> BenchSettings:
    """The settings of a run, or UsageError for a figure out of range."""
    sizes = list(dict.fromkeys(value_sizes or DEFAULT_VALUE_SIZES))
    require_at_least(
        *shape_checks(producers, partitions, replication_factor, rounds),
        ("--idle-partitions", idle_partitions, 0),
        ("--records", records, 1),
        *(("--value-size", size, 1) for size in sizes),
    )
    counts = {
        size: records if records is not None else DEFAULT_RECORDS.get(size, default_count(size))
        for size in sizes
    }
    return BenchSettings(
        sizes, counts, producers, partitions, replication_factor, idle_partitions, rounds
    )


def default_count(size: int) -> int:
    # Sizes without a documented default move about 200 MB of values, at most 1M records.
    return max(1_000, min(1_000_000, 200 * MB // size))


def throughput_targets(
    addresses: list[str],
    embedded: bool,
    tansu: bool,
    tansu_path: str | None,
    kafka: Sequence[TargetSpec] = (),
) -> list[TargetSpec]:
    """The given addresses, then the brokers to start: both onceflow kinds, Tansu, and the
    Apache Kafka targets (kafka_target.kafka_targets)."""
    specs = [parse_target(address) for address in addresses]
    if embedded:
        specs.append(TargetSpec("onceflow (fsync)", launch=onceflow_launcher(fsync=True)))
        specs.append(TargetSpec("onceflow (no fsync)", launch=onceflow_launcher(fsync=False)))
    if tansu:
        binary = tansu_path or tansu_binary()
        if binary is None:
            raise UsageError("--tansu: no tansu executable found; give --tansu-binary PATH.")
        specs.append(TargetSpec("tansu (memory)", launch=tansu_launcher(binary)))
    specs.extend(kafka)
    return specs
