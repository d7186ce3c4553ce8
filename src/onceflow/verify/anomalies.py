"""What the checker reports: the kinds of anomaly, each anomaly with the offending values
and offsets, and the result of a check (see checker.py for what each kind means)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

KINDS = (
    "aborted-read",
    "phantom-read",
    "lost-write",
    "duplicate",
    "inconsistent-offset",
    "nonmonotonic-poll",
    "poll-skip",
    "torn-transaction",
    "aborted-offsets",
    "phantom-offsets",
    "hanging-transaction",
    "last-value-lost",
    "offset-changed",
    "reordered",  # the mirror's target view (mirror_check.py)
)
MAX_LISTED = 10  # offending values listed per anomaly, beyond which only a count is given


@dataclass(frozen=True)
class Anomaly:
    kind: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, **self.details}


@dataclass
class CheckResult:
    anomalies: list[Anomaly]
    stats: dict[str, Any]

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def counts(self) -> dict[str, int]:
        found = Counter(a.kind for a in self.anomalies)
        return {kind: found.get(kind, 0) for kind in KINDS}

    def by_kind(self) -> dict[str, list[Anomaly]]:
        out: dict[str, list[Anomaly]] = {kind: [] for kind in KINDS}
        for anomaly in self.anomalies:
            out.setdefault(anomaly.kind, []).append(anomaly)
        return out


def listed(items: Iterable[Any]) -> list[Any]:
    """The first MAX_LISTED of them."""
    return list(items)[:MAX_LISTED]


def listed_rows(items: Iterable[Iterable[Any]]) -> list[list[Any]]:
    """The first MAX_LISTED places or values, each as a JSON list."""
    return [list(x) for x in listed(items)]


def place_details(
    t: str, p: int, o: int, value: str | None = None, reader: str | None = None
) -> dict[str, Any]:
    """The details naming one record, in the order reports show them."""
    place: dict[str, Any] = {} if reader is None else {"reader": reader}
    place.update(topic=t, partition=p, offset=o)
    if value is not None:
        place["value"] = value
    return place
