"""The benchmarks' tables: figures to read, one row per target and kind, on stdout."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.table import Table

from onceflow.bench.eos_figures import (
    ISOLATIONS,
    PRODUCERS,
    EosMeasurement,
    Transactions,
    target_results,
)
from onceflow.bench.stats import Phase
from onceflow.bench.throughput import IdleMeasurement, Measurement, ratios
from onceflow.tools.output import result_table


def size_text(size: int) -> str:
    """A value size as people write it: "100 B", "1 KiB"."""
    return f"{size // 1024} KiB" if size >= 1024 and size % 1024 == 0 else f"{size} B"


def mib(value: int | None) -> str:
    return f"{value / (1024 * 1024):.1f} MiB" if value else "-"


# --- onceflow bench ----------------------------------------------------------------------------


def results_table(measurements: list[Measurement], baseline: str) -> Table:
    table = result_table(
        "Target",
        "Value",
        "Records",
        "Produce rec/s",
        "Produce MB/s",
        "Consume rec/s",
        "Consume MB/s",
        "Produce vs base",
        "Consume vs base",
        "RSS max",
        "RSS end",
        right_from=1,
    )
    found = ratios(measurements, baseline)
    for m in measurements:
        produce_ratio, consume_ratio = found[(m.target, m.value_size)]
        failed = f"failed: {m.error}" if m.error else "-"
        table.add_row(
            m.target,
            size_text(m.value_size),
            f"{m.records:,}",
            f"{m.produce.records_per_s:,.0f}" if m.produce else failed,
            f"{m.produce.mb_per_s:.1f}" if m.produce else "-",
            f"{m.consume.records_per_s:,.0f}" if m.consume else "-",
            f"{m.consume.mb_per_s:.1f}" if m.consume else "-",
            f"{produce_ratio:.2f}x" if produce_ratio is not None else "-",
            f"{consume_ratio:.2f}x" if consume_ratio is not None else "-",
            mib(m.rss_max),
            mib(m.rss_end),
        )
    return table


def _figure(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def cost_table(measurements: list[Measurement]) -> Table:
    """What the median round cost each started broker, and how long Produce requests took to
    be answered (the clients' round trips, librdkafka's statistics: any target)."""
    table = result_table(
        "Target",
        "Value",
        "Produce requests",
        "CPU us/request",
        "CPU us/record produced",
        "CPU us/record consumed",
        "Ack p50 ms",
        "Ack p99 ms",
        right_from=1,
    )
    for m in measurements:
        produce, consume = m.produce_cost, m.consume_cost
        table.add_row(
            m.target,
            size_text(m.value_size),
            _figure(produce.requests, 0),
            _figure(produce.cpu_us_per_request, 0),
            _figure(produce.cpu_us_per_record, 2),
            _figure(consume.cpu_us_per_record, 2),
            _figure(produce.rtt_p50_ms, 2),
            _figure(produce.rtt_p99_ms, 2),
        )
    return table


def idle_table(idle: list[IdleMeasurement]) -> Table:
    table = result_table("Target", "Idle partitions", "RSS empty", "RSS with idle partitions")
    for item in idle:
        table.add_row(item.target, str(item.partitions), mib(item.rss_empty), mib(item.rss_idle))
    return table


# --- onceflow bench-eos ------------------------------------------------------------------------


def producers_table(measurements: list[EosMeasurement]) -> Table:
    def cells(m: EosMeasurement, mode: str) -> tuple[Phase | None, str]:
        t = m.transactions
        if mode == "transactional" and t is not None:
            return m.produce.get(mode), f"{t.committed} committed, {t.aborted} aborted"
        return m.produce.get(mode), "-"

    return _phases_table(measurements, "Producer", PRODUCERS, "Transactions", cells)


def consumers_table(measurements: list[EosMeasurement]) -> Table:
    def cells(m: EosMeasurement, isolation: str) -> tuple[Phase | None, str]:
        phase = m.consume.get(isolation)
        return phase, f"{phase.seconds:.2f}" if phase else "-"

    return _phases_table(measurements, "Isolation", ISOLATIONS, "Seconds", cells)


def _phases_table(
    measurements: list[EosMeasurement],
    kind_column: str,
    kinds: Sequence[str],
    last_column: str,
    cells: Callable[[EosMeasurement, str], tuple[Phase | None, str]],
) -> Table:
    """One row per target and kind: the median round's figures, then one column of its own."""
    table = result_table(
        "Target", kind_column, "Records", "rec/s", "MB/s", last_column, right_from=2
    )
    for m in measurements:
        for kind in kinds:
            phase, last = cells(m, kind)
            table.add_row(m.target, kind, *_phase_cells(phase, m.error), last)
    return table


def latency_table(measurements: list[EosMeasurement]) -> Table:
    table = result_table("Target", "Step", "Count", "p50 ms", "p99 ms", "Max ms", right_from=2)
    for m in measurements:
        t = m.transactions or Transactions()
        for call, latency in (
            ("commit_transaction()", t.commit),
            ("abort_transaction()", t.abort),
            ("flush before commit/abort", t.flush),
            ("begin to first record acked", t.first_ack),
            ("whole transaction", t.duration),
        ):
            if latency is None:
                table.add_row(m.target, call, "0", "-", "-", "-")
                continue
            table.add_row(
                m.target,
                call,
                f"{latency.count:,}",
                f"{latency.p50:.1f}",
                f"{latency.p99:.1f}",
                f"{latency.max:.1f}",
            )
    return table


def eos_cost_table(measurements: list[EosMeasurement]) -> Table:
    """Each kind's cost to a started broker, and the producers' round trips (any target)."""
    table = result_table(
        "Target",
        "Phase",
        "Produce requests",
        "CPU us/request",
        "CPU us/record",
        "Ack p50 ms",
        "Ack p99 ms",
        right_from=2,
    )
    for m in measurements:
        for phase, cost in m.costs().items():
            table.add_row(
                m.target,
                phase,
                _figure(cost.requests, 0),
                _figure(cost.cpu_us_per_request, 0),
                _figure(cost.cpu_us_per_record, 2),
                _figure(cost.rtt_p50_ms, 2),
                _figure(cost.rtt_p99_ms, 2),
            )
    return table


def targets_table(measurements: list[EosMeasurement]) -> Table:
    table = result_table("Target", "Figure", "Measured", "Kafka's target", "Result")
    for m in measurements:
        for target, value, met in target_results(m):
            result = "-" if met is None else ("met" if met else "not met")
            table.add_row(m.target, target.figure, target.text(value), target.target, result)
    return table


def _phase_cells(phase: Phase | None, error: str | None) -> list[str]:
    if phase is None:
        return ["-", f"failed: {error}" if error else "-", "-"]
    return [f"{phase.records:,}", f"{phase.records_per_s:,.0f}", f"{phase.mb_per_s:.1f}"]
