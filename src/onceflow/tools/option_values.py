"""Option values as the tools parse them (the command line, the benchmarks, the pipelines): a
bad one is a UsageError, one line on stderr and exit 2."""

from __future__ import annotations

from collections.abc import Iterable

from onceflow.tools.errors import UsageError


def parse_pairs(values: Iterable[str], option: str) -> dict[str, str]:
    """`k=v` strings (as given to a repeatable option) to a dict; UsageError when malformed."""
    pairs: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"Invalid {option} '{item}': expected KEY=VALUE.")
        pairs[key.strip()] = value
    return pairs


def require_at_least(*checks: tuple[str, float | None, float]) -> None:
    """UsageError for the first (option, value, lowest) whose value is below its lowest (an
    option not given, None, passes)."""
    for name, value, low in checks:
        if value is not None and value < low:
            raise UsageError(f"{name} must be at least {low}, not {value}.")


def parse_bool(value: str, name: str) -> bool:
    """A Kafka-style boolean property value."""
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise UsageError(f"Invalid value '{value}' for {name}: expected true or false.")
    return lowered == "true"
