"""Planning offsets: Spark's JSON, rate limiting, range splitting (pure, no Spark, no broker)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.spark.offset_ranges import (
    EARLIEST,
    LATEST,
    OffsetRange,
    OffsetSpecError,
    from_spark_json,
    plan_ranges,
    rate_limit,
    resolve,
    to_spark_json,
)

partitions = st.dictionaries(
    st.tuples(st.sampled_from(["a", "b", "topic-c"]), st.integers(0, 11)),
    st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)),
    min_size=1,
    max_size=12,
)


def _split(pairs: dict) -> tuple[dict, dict]:
    start = {tp: min(a, b) for tp, (a, b) in pairs.items()}
    end = {tp: max(a, b) for tp, (a, b) in pairs.items()}
    return start, end


def test_spark_json_is_sorted_by_topic_then_partition_number() -> None:
    offsets = {("b", 10): 5, ("a", 2): 1, ("b", 9): 7, ("a", 10): 3}
    text = json.dumps(to_spark_json(offsets))
    assert text == '{"a": {"2": 1, "10": 3}, "b": {"9": 7, "10": 5}}'
    assert from_spark_json(text) == offsets


def test_equal_offsets_give_equal_json_whatever_the_insertion_order() -> None:
    one = to_spark_json({("x", 1): 4, ("x", 0): 2})
    two = to_spark_json({("x", 0): 2, ("x", 1): 4})
    assert json.dumps(one) == json.dumps(two)


@pytest.mark.parametrize("bad", ["[1]", '{"t": 3}', '{"t": {"zero": 1}}', "not json"])
def test_malformed_offsets_are_rejected(bad: str) -> None:
    with pytest.raises(OffsetSpecError):
        from_spark_json(bad)


def test_resolve_replaces_earliest_and_latest_only() -> None:
    spec = {("t", 0): EARLIEST, ("t", 1): LATEST, ("t", 2): 17}
    earliest = {("t", 0): 3, ("t", 1): 0, ("t", 2): 0}
    latest = {("t", 0): 9, ("t", 1): 40, ("t", 2): 50}
    assert resolve(spec, earliest, latest) == {("t", 0): 3, ("t", 1): 40, ("t", 2): 17}


def test_rate_limit_prorates_by_backlog_as_spark_does() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 7}
    latest = {("t", 0): 300, ("t", 1): 200, ("t", 2): 7}
    # backlogs 300 and 100: 75% and 25% of 100
    assert rate_limit(start, latest, 100) == {("t", 0): 75, ("t", 1): 125, ("t", 2): 7}


def test_rate_limit_gives_every_backlogged_partition_at_least_one_offset() -> None:
    start = {("t", 0): 0, ("t", 1): 0}
    latest = {("t", 0): 1000, ("t", 1): 1}
    limited = rate_limit(start, latest, 10)
    assert limited[("t", 1)] == 1 and limited[("t", 0)] == 9


@given(partitions, st.integers(1, 5_000))
def test_rate_limit_stays_within_bounds(pairs: dict, limit: int) -> None:
    start, latest = _split(pairs)
    limited = rate_limit(start, latest, limit)
    assert set(limited) == set(latest)
    for tp in latest:
        assert start[tp] <= limited[tp] <= latest[tp]
    admitted = sum(limited[tp] - start[tp] for tp in latest)
    backlogged = sum(1 for tp in latest if latest[tp] > start[tp])
    # at most the limit, plus one per partition rounded up from a share below one
    assert admitted <= limit + backlogged
    if sum(latest[tp] - start[tp] for tp in latest) > 0:
        assert admitted > 0


@given(partitions, st.one_of(st.none(), st.integers(1, 40)))
def test_plan_ranges_covers_each_partition_exactly(pairs: dict, min_partitions: int | None) -> None:
    start, end = _split(pairs)
    ranges = plan_ranges(start, end, min_partitions)
    assert ranges == plan_ranges(start, end, min_partitions)  # deterministic
    covered: dict[tuple[str, int], list[OffsetRange]] = {}
    for r in ranges:
        assert r.size > 0
        covered.setdefault((r.topic, r.partition), []).append(r)
    for tp in start:
        pieces = covered.get(tp, [])
        assert sum(r.size for r in pieces) == end[tp] - start[tp]
        for before, after in itertools.pairwise(pieces):
            assert before.end == after.start
        if pieces:
            assert pieces[0].start == start[tp] and pieces[-1].end == end[tp]


def test_min_partitions_splits_big_ranges_in_proportion() -> None:
    start = {("t", 0): 0, ("t", 1): 0}
    end = {("t", 0): 900, ("t", 1): 100}
    ranges = plan_ranges(start, end, 10)
    assert [(r.partition, r.start, r.end) for r in ranges] == [
        (0, 0, 100),
        (0, 100, 200),
        (0, 200, 300),
        (0, 300, 400),
        (0, 400, 500),
        (0, 500, 600),
        (0, 600, 700),
        (0, 700, 800),
        (0, 800, 900),
        (1, 0, 100),
    ]


def test_plan_ranges_refuses_an_end_before_its_start() -> None:
    with pytest.raises(OffsetSpecError):
        plan_ranges({("t", 0): 10}, {("t", 0): 5})
