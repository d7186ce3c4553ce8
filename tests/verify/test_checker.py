"""The checker on hand-made histories: clean ones pass, each anomaly is flagged, with the
offending values and offsets."""

from __future__ import annotations

from typing import Any

import pytest

from onceflow.verify.anomalies import KINDS, CheckResult
from onceflow.verify.checker import check
from onceflow.verify.history import UNKNOWN, History
from tests.verify.histories import (
    ALL_UNCOMMITTED,
    COPY,
    FAIL,
    OK,
    OUT,
    READ_UNCOMMITTED,
    V1,
    V2,
    V3,
    V4,
    A,
    B,
    Placed,
    Scenario,
    clean,
)


def only(result: CheckResult, kind: str) -> list[dict[str, Any]]:
    """The anomalies found, which must all be of `kind` (at least one)."""
    kinds = {a.kind for a in result.anomalies}
    assert kinds == {kind}, [a.to_json() for a in result.anomalies]
    return [a.to_json() for a in result.anomalies]


def test_a_clean_history_passes() -> None:
    result = check(clean().ops)
    assert result.valid, [a.to_json() for a in result.anomalies]
    assert result.counts() == dict.fromkeys(KINDS, 0)
    stats = result.stats
    assert (stats["committed"], stats["aborted"], stats["unknown"]) == (3, 1, 0)
    assert stats["values_committed"] == 4
    assert stats["copy_transactions"] == 1


@pytest.mark.parametrize("visible", [True, False])
def test_unknown_outcomes_are_allowed_either_way(visible: bool) -> None:
    v5, v6 = (A, 1, 0, "p3.1.0"), (B, 1, 0, "p3.1.1")
    s = Scenario()
    s.txn("p3#1", "p3.1", [v5, v6], UNKNOWN)
    s.finals([v5, v6] if visible else [], [v5, v6], {(A, 1): 2, (B, 1): 2})
    result = check(s.ops)
    assert result.valid, [a.to_json() for a in result.anomalies]
    assert result.stats["unknown_committed"] == int(visible)


def test_aborted_read() -> None:
    found = only(check(clean(extra=lambda s: s.poll("rc#2", [V1, V3])).ops), "aborted-read")
    assert found == [
        {
            "kind": "aborted-read",
            "message": found[0]["message"],
            "reader": "rc#2",
            "topic": A,
            "partition": 0,
            "offset": 2,
            "value": "p2.1.0",
            "txn": "p2.1",
            "txn_outcome": FAIL,
        }
    ]


def test_aborted_read_by_a_copier_and_in_the_final_read() -> None:
    aborted_copy: Placed = (OUT, 0, 2, "p2.1.0>c.2")

    def copier_reads_aborted(s: Scenario) -> None:
        s.txn("c#1", "c.2", [aborted_copy], FAIL, reads=[V3], offsets=[(A, 0, 3)])

    uncommitted = [*ALL_UNCOMMITTED, aborted_copy]
    found = only(
        check(clean(extra=copier_reads_aborted, uncommitted=uncommitted).ops), "aborted-read"
    )
    assert [(f["reader"], f["value"]) for f in found] == [("c#1", "p2.1.0")]
    result = check(clean(committed=[V1, V3, V4, V2, COPY]).ops)
    aborted = [a.to_json() for a in result.anomalies if a.kind == "aborted-read"]
    assert [(f["reader"], f["offset"]) for f in aborted] == [("final-rc", 2)]
    # The reader that rightly skipped V3 now looks as if it skipped a committed record.
    assert {a.kind for a in result.anomalies} == {"aborted-read", "poll-skip"}


def test_lost_write_acknowledged_commit_missing_from_the_final_read() -> None:
    result = check(clean(committed=[V1, V2, COPY]).ops)
    found = only(result, "lost-write")
    assert found[0]["txn"] == "p1.2"
    assert found[0]["missing"] == [[A, 0, 4, "p1.2.0"]]


def test_lost_write_seen_committed_then_gone() -> None:
    v5: Placed = (A, 1, 0, "p3.1.0")

    def unknown_but_read(s: Scenario) -> None:
        s.txn("p3#1", "p3.1", [v5], UNKNOWN)
        s.poll("rc#2", [v5])

    s = clean(extra=unknown_but_read)
    s.final("read_committed", [], {(A, 1): 2})  # the partition's own final pass: empty
    found = only(check(s.ops), "lost-write")
    assert found[0]["value"] == "p3.1.0" and found[0]["reader"] == "rc#2"


def test_lost_write_acknowledged_write_missing_from_the_log() -> None:
    found = only(check(clean(uncommitted=[V1, V4, V2, COPY]).ops), "lost-write")
    assert found[0]["txn"] == "p2.1" and found[0]["missing"] == [list(V3)]


def test_lost_write_consumed_input_without_a_committed_copy() -> None:
    # The group's offset says V1 and V4 were consumed (offset 5), but only V1 was copied.
    def offsets_past_v4(s: Scenario) -> None:
        s.txn("c#1", "c.2", [], OK, reads=[V4], offsets=[(A, 0, 5)])

    result = check(clean(extra=offsets_past_v4, final_offsets=[(A, 0, 5)]).ops)
    found = only(result, "lost-write")
    assert (found[0]["value"], found[0]["offset"], found[0]["group_offset"]) == ("p1.2.0", 4, 5)


def test_duplicate_value_at_two_offsets() -> None:
    again: Placed = (A, 0, 6, V4[3])
    session = [V1, V3, V4, again]
    result = check(clean(extra=lambda s: s.poll("ru#2", session, READ_UNCOMMITTED)).ops)
    found = only(result, "duplicate")
    assert found[0]["value"] == "p1.2.0"
    assert found[0]["offsets"] == [[A, 0, 4], [A, 0, 6]]


def test_duplicate_copies_of_one_input() -> None:
    copy2: Placed = (OUT, 0, 2, "p1.1.0>c.2")

    def copied_twice(s: Scenario) -> None:
        s.txn("c#2", "c.2", [copy2], OK, reads=[V1], offsets=[(A, 0, 1)])

    committed = [V1, V4, V2, COPY, copy2]
    uncommitted = [*ALL_UNCOMMITTED, copy2]
    result = check(clean(extra=copied_twice, committed=committed, uncommitted=uncommitted).ops)
    found = only(result, "duplicate")
    assert found[0]["value"] == "p1.1.0"
    assert [c[3] for c in found[0]["copies"]] == ["p1.1.0>c.1", "p1.1.0>c.2"]


def test_inconsistent_offset() -> None:
    v5: Placed = (A, 0, 4, "p3.1.0")  # at V4's offset

    def clash(s: Scenario) -> None:
        s.txn("p3#1", "p3.1", [v5], FAIL)

    found = [a for a in check(clean(extra=clash).ops).anomalies if a.kind == "inconsistent-offset"]
    assert len(found) == 1
    details = found[0].to_json()
    assert (details["topic"], details["partition"], details["offset"]) == (A, 0, 4)
    assert set(details["values"]) == {"p1.2.0", "p3.1.0"}


def test_nonmonotonic_poll() -> None:
    found = only(check(clean(extra=lambda s: s.poll("rc#1", [V1])).ops), "nonmonotonic-poll")
    assert (found[0]["offset"], found[0]["previous_offset"]) == (0, 4)


def test_poll_skip() -> None:
    # A read_uncommitted consumer that goes from offset 0 to 4 never saw V3 at offset 2.
    found = only(
        check(clean(extra=lambda s: s.poll("ru#2", [V1, V4], READ_UNCOMMITTED)).ops), "poll-skip"
    )
    assert (found[0]["from_offset"], found[0]["to_offset"]) == (0, 4)
    assert found[0]["missed"] == [[2, "p2.1.0"]]
    # Skipping the aborted V3 is what a read_committed consumer must do.
    assert check(clean(extra=lambda s: s.poll("rc#2", [V1, V4])).ops).valid


def test_torn_transaction_in_the_final_read() -> None:
    result = check(clean(committed=[V1, V4, COPY]).ops)  # V2, V1's partner, missing
    kinds = {a.kind for a in result.anomalies}
    assert "torn-transaction" in kinds
    torn = next(a.to_json() for a in result.anomalies if a.kind == "torn-transaction")
    assert torn["txn"] == "p1.1"
    assert torn["visible"] == [[A, 0, "p1.1.0"]] and torn["missing"] == [[B, 0, "p1.1.1"]]


def test_torn_transaction_seen_by_a_reader() -> None:
    # The reader saw V1, then read B-0 past V2's offset (V2 at 0, the next record at 2)
    # without V2: it saw part of p1.1.
    later: Placed = (B, 0, 2, "p1.3.0")

    def partial(s: Scenario) -> None:
        s.txn("p1#1", "p1.3", [later], OK)
        s.poll("rc#2", [V1, later])

    committed = [V1, V4, V2, later, COPY]
    uncommitted = [V1, V3, V4, V2, later, COPY]
    result = check(clean(extra=partial, committed=committed, uncommitted=uncommitted).ops)
    found = only(result, "torn-transaction")
    assert found[0]["reader"] == "rc#2" and found[0]["txn"] == "p1.1"
    assert found[0]["passed"] == [[B, 0, 0, "p1.1.1"]]


def test_torn_transaction_copy_without_its_offsets() -> None:
    result = check(clean(final_offsets=[(A, 0, 0)]).ops)
    torn = [a.to_json() for a in result.anomalies if a.kind == "torn-transaction"]
    assert [(t["value"], t["group_offset"]) for t in torn] == [("p1.1.0", 0)]
    # No transaction committed offset 0 either.
    assert {a.kind for a in result.anomalies} == {"torn-transaction", "phantom-offsets"}


def test_offsets_committed_by_an_aborted_transaction() -> None:
    def aborted_offsets(s: Scenario) -> None:
        s.txn("c#1", "c.2", [(OUT, 0, 2, "p1.2.0>c.2")], FAIL, reads=[V4], offsets=[(A, 0, 5)])
        s.offsets("offsets#1", [(A, 0, 5)])

    committed = [V1, V4, V2, COPY]
    uncommitted = [V1, V3, V4, V2, COPY, (OUT, 0, 2, "p1.2.0>c.2")]
    result = check(clean(extra=aborted_offsets, committed=committed, uncommitted=uncommitted).ops)
    found = only(result, "aborted-offsets")
    assert (found[0]["topic"], found[0]["offset"]) == (A, 5)
    assert list(found[0]["txns"]) == ["c.2"]


def test_phantom_offsets_and_phantom_reads() -> None:
    result = check(clean(extra=lambda s: s.offsets("offsets#1", [(A, 0, 3)])).ops)
    assert only(result, "phantom-offsets")[0]["offset"] == 3
    stranger: Placed = (A, 0, 7, "nobody-wrote-this")
    session = [V1, V3, V4, stranger]
    result = check(clean(extra=lambda s: s.poll("ru#2", session, READ_UNCOMMITTED)).ops)
    assert only(result, "phantom-read")[0]["value"] == "nobody-wrote-this"
    misplaced: Placed = (B, 0, 1, V4[3])  # V4 was written to A-0
    session = [V2, misplaced]
    result = check(clean(extra=lambda s: s.poll("ru#3", session, READ_UNCOMMITTED)).ops)
    assert "phantom-read" in {a.kind for a in result.anomalies}


def test_hanging_transaction() -> None:
    s = Scenario()
    s.txn("p1#1", "p1.1", [V1, V2], OK)
    s.final("read_committed", [V2], {(A, 0): 2, (B, 0): 2}, positions={(A, 0): 0})
    s.final("read_uncommitted", [V1, V2], {(A, 0): 2, (B, 0): 2})
    found = only(check(s.ops), "hanging-transaction")
    assert (found[0]["topic"], found[0]["position"], found[0]["high_watermark"]) == (A, 0, 2)


def test_a_crashed_client_transaction_is_failed_unless_its_commit_was_requested() -> None:
    history = History(start=0.0)
    history.append("p#1", "invoke", "txn", {"txn": "t1", "intent": "commit", "writes": []})
    [before] = history.crashed("p#1", "SIGKILL")
    assert (before.type, before.value["txn"]) == (FAIL, "t1")
    history.append("p#2", "invoke", "txn", {"txn": "t2", "intent": "commit", "writes": []})
    history.append("p#2", "info", "txn-end", {"txn": "t2", "end": "commit", "delivered": []})
    assert history.txn_phase("p#2") == "commit"
    [after] = history.crashed("p#2", "SIGKILL")
    assert after.type == UNKNOWN
    assert history.crashed("p#2", "again") == []  # nothing left open
