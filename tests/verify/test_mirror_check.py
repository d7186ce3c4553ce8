"""The mirror's target view on hand-made histories: a clean target passes; a duplicate, a
missing record, an aborted record and two records swapped are each flagged, compared by value
and partition order (target offsets differ from the source's)."""

from __future__ import annotations

import pytest

from onceflow.verify.checker import check
from onceflow.verify.history import READ_COMMITTED
from onceflow.verify.mirror_check import MIRROR_READ, check_mirror, source_ops
from tests.verify.histories import COPY, V1, V2, V3, V4, Placed, Scenario, clean


def renamed(t: str) -> str:
    return f"source.{t}"


def on_target(placed: Placed, offset: int) -> Placed:
    t, p, _, value = placed
    return (renamed(t), p, offset, value)


# The clean target: the source's committed records, each once, at offsets of its own (the
# source's aborted transaction and markers took A-0:1..3 there, not here).
CLEAN = [on_target(V1, 0), on_target(V4, 2), on_target(V2, 0), on_target(COPY, 0)]


def mirrored(records: list[Placed]) -> Scenario:
    s = clean()
    ends: dict[tuple[str, int], int] = {}
    for t, p, o, _ in records:
        ends[(t, p)] = max(ends.get((t, p), 0), o + 2)  # one past its commit marker
    s.final(READ_COMMITTED, records, ends, process=MIRROR_READ)
    return s


def kinds(s: Scenario) -> list[str]:
    return sorted(a.kind for a in check_mirror(s.ops, renamed))


def test_clean_target_passes_and_the_source_check_ignores_the_target_read() -> None:
    s = mirrored(CLEAN)
    assert kinds(s) == []
    assert check(source_ops(s.ops)).valid


@pytest.mark.parametrize(
    ("target", "expected", "value"),
    [
        ([*CLEAN[:2], on_target(V1, 4), *CLEAN[2:]], ["duplicate"], V1[3]),
        ([CLEAN[0], *CLEAN[2:]], ["lost-write"], V4[3]),
        ([*CLEAN[:1], on_target(V3, 1), *CLEAN[1:]], ["aborted-read"], V3[3]),
        ([on_target(V4, 0), on_target(V1, 2), *CLEAN[2:]], ["reordered"], V1[3]),
        ([*CLEAN, on_target((V2[0], V2[1], 0, "nobody"), 2)], ["phantom-read"], "nobody"),
    ],
    ids=["duplicate", "missing", "aborted", "reordered", "phantom"],
)
def test_each_target_anomaly_is_flagged(
    target: list[Placed], expected: list[str], value: str
) -> None:
    found = check_mirror(mirrored(target).ops, renamed)
    assert sorted(a.kind for a in found) == expected
    details = found[0].details
    assert value in (details.get("value"), *details.get("values", []))


def test_a_target_read_short_of_its_end_is_hanging() -> None:
    s = clean()
    ends = {(t, p): o + 2 for t, p, o, _ in CLEAN}
    stopped = {(renamed(V2[0]), 0): 0}
    s.final(READ_COMMITTED, CLEAN[:2] + CLEAN[3:], ends, stopped, process=MIRROR_READ)
    assert kinds(s) == ["hanging-transaction", "lost-write"]
