"""What every benchmark's workload has: producer processes writing topics of some partitions
and replicas, measured in rounds, with clients whose settings the command line overrides."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from onceflow.tools.option_values import parse_pairs

Check = tuple[str, float | None, float]  # (option, value, lowest), for require_at_least


def shape_checks(
    producers: int, partitions: int, replication_factor: int, rounds: int
) -> list[Check]:
    """The bounds of the options every benchmark has."""
    return [
        ("--producers", producers, 1),
        ("--partitions", partitions, 1),
        ("--replication-factor", replication_factor, 1),
        ("--rounds", rounds, 1),
    ]


def client_settings(
    defaults: Mapping[str, Any], overrides: Iterable[str] | None, option: str
) -> dict[str, Any]:
    """A client's settings: the benchmark's own, then the `option` KEY=VALUE overrides."""
    return {**defaults, **parse_pairs(overrides or [], option)}
