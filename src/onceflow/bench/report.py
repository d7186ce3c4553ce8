"""The benchmarks' JSON documents (--json): the settings, every round and the medians."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from onceflow.bench.eos_figures import EosMeasurement, target_results
from onceflow.bench.eos_run import EosSettings
from onceflow.bench.stats import BrokerCost, Phase
from onceflow.bench.throughput import BenchSettings, IdleMeasurement, Measurement, ratios


def throughput_json(
    measurements: list[Measurement],
    idle: list[IdleMeasurement],
    baseline: str,
    settings: BenchSettings,
) -> dict[str, Any]:
    found = ratios(measurements, baseline)
    return {
        "baseline": baseline,
        "settings": {
            "value_sizes": settings.value_sizes,
            "records": {str(k): v for k, v in settings.records.items()},
            "producers": settings.producers,
            "partitions": settings.partitions,
            "replication_factor": settings.replication_factor,
            "rounds": settings.rounds,
            "warm_up_rounds": settings.warm_up_rounds,
            "producer": dict(settings.producer_settings),
            "consumer": dict(settings.consumer_settings),
        },
        "results": [
            {
                "target": m.target,
                "value_size": m.value_size,
                "records": m.records,
                "produce": m.produce.as_json() if m.produce else None,
                "consume": m.consume.as_json() if m.consume else None,
                "ratio_vs_baseline": dict(
                    zip(("produce", "consume"), found[(m.target, m.value_size)], strict=True)
                ),
                "produce_cost": m.produce_cost.as_json(),
                "consume_cost": m.consume_cost.as_json(),
                "rss_max_bytes": m.rss_max,
                "rss_end_bytes": m.rss_end,
                "produce_rounds": [phase.as_json() for phase in m.produce_rounds],
                "consume_rounds": [phase.as_json() for phase in m.consume_rounds],
                "produce_cost_rounds": [cost.as_json() for cost in m.produce_costs],
                "consume_cost_rounds": [cost.as_json() for cost in m.consume_costs],
                "rss_rounds": [
                    {"rss_max_bytes": peak, "rss_end_bytes": end} for peak, end in m.rss_rounds
                ],
                "error": m.error,
            }
            for m in measurements
        ],
        "idle": [asdict(item) for item in idle],
    }


def eos_json(measurements: list[EosMeasurement], settings: EosSettings) -> dict[str, Any]:
    return {
        "settings": {
            "records": settings.records,
            "value_size": settings.value_size,
            "producers": settings.producers,
            "partitions": settings.partitions,
            "replication_factor": settings.replication_factor,
            "commit_interval_ms": settings.commit_interval_ms,
            "abort_ratio": settings.abort_ratio,
            "rounds": settings.rounds,
            "warm_up_rounds": settings.warm_up_rounds,
            "producer": dict(settings.producer_settings),
            "consumer": dict(settings.consumer_settings),
        },
        "results": [
            {
                "target": m.target,
                "error": m.error,
                "produce": {mode: phase.as_json() for mode, phase in m.produce.items()},
                "consume": {name: phase.as_json() for name, phase in m.consume.items()},
                "produce_rounds": _rounds_json(m.produce_rounds),
                "consume_rounds": _rounds_json(m.consume_rounds),
                "transactions": m.transactions.as_json() if m.transactions else None,
                "costs": {phase: cost.as_json() for phase, cost in m.costs().items()},
                "produce_cost_rounds": _costs_json(m.produce_costs),
                "consume_cost_rounds": _costs_json(m.consume_costs),
                "consumed_topic": (
                    dict(zip(("records", "committed_records"), m.consumed_topic, strict=True))
                    if m.consumed_topic
                    else None
                ),
                "kafka_targets": [
                    {
                        "key": target.key,
                        "figure": target.figure,
                        "measured": None if value is None else round(value, 4),
                        "target": target.target,
                        "met": met,
                    }
                    for target, value, met in target_results(m)
                ],
            }
            for m in measurements
        ],
    }


def _rounds_json(rounds: dict[str, list[Phase]]) -> dict[str, list[dict[str, float]]]:
    return {name: [phase.as_json() for phase in phases] for name, phases in rounds.items()}


def _costs_json(rounds: dict[str, list[BrokerCost]]) -> dict[str, list[dict[str, object]]]:
    return {name: [cost.as_json() for cost in costs] for name, costs in rounds.items()}
