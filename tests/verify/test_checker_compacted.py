"""The checker on hand-made histories of a compacted topic: what the cleaner may remove is
excused, and the three compaction checks (the last committed value of every key readable, no
aborted value visible after cleaning, no offset of a surviving record changed) each flag a
tampered history."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onceflow.verify.checker import CheckResult, check
from onceflow.verify.history import READ_COMMITTED, UNKNOWN
from tests.verify.histories import FAIL, OK, READ_UNCOMMITTED, Placed, Scenario

K = "kv"  # compacted; k1 and k3 in partition 0, k2 in partition 1
COMPACT = {"cleanup.policy": "compact", "segment.bytes": "1024"}
K1_OLD: Placed = (K, 0, 0, "p1.1.k1.0")
K2_OLD: Placed = (K, 1, 0, "p1.1.k2.0")  # same transaction as K1_OLD; commit markers at 1
K1_LAST: Placed = (K, 0, 2, "p1.2.k1.0")  # supersedes K1_OLD
K1_ABORTED: Placed = (K, 0, 4, "p2.1.k1.0")  # aborted on purpose; its abort marker at 5
K2_DELETE: Placed = (K, 1, 2, "p1.3.k2.0.tombstone")
K3_LAST: Placed = (K, 0, 6, "p1.4.k3.0")
KEYS = {
    K1_OLD[3]: ("k1", False),
    K2_OLD[3]: ("k2", False),
    K1_LAST[3]: ("k1", False),
    K1_ABORTED[3]: ("k1", False),
    K2_DELETE[3]: ("k2", True),
    K3_LAST[3]: ("k3", False),
}
ENDS = {(K, 0): 8, (K, 1): 4}
CLEANED = [K1_LAST, K3_LAST]  # both final passes, once the cleaner ran


def keys(*placed: Placed) -> dict[str, tuple[str, bool]]:
    return {r[3]: KEYS.get(r[3], (r[3].split(".")[2], r[3].endswith("tombstone"))) for r in placed}


def compacted(
    *,
    committed: list[Placed] | None = None,
    uncommitted: list[Placed] | None = None,
    extra: Callable[[Scenario], Any] | None = None,
    policy: dict[str, str] | None = None,
) -> Scenario:
    """k1 overwritten (and an aborted write of it), k2 written then deleted, k3 written once;
    readers saw it all as it happened; the final passes see the cleaned log: the last value of
    k1 and k3, nothing of k2."""
    s = Scenario()
    s.topics({K: (2, COMPACT if policy is None else policy)})
    s.txn("p1#1", "p1.1", [K1_OLD, K2_OLD], OK, keys=keys(K1_OLD, K2_OLD))
    s.txn("p1#1", "p1.2", [K1_LAST], OK, keys=keys(K1_LAST))
    s.txn("p2#1", "p2.1", [K1_ABORTED], FAIL, intent="abort", keys=keys(K1_ABORTED))
    s.txn("p1#1", "p1.3", [K2_DELETE], OK, keys=keys(K2_DELETE))
    s.txn("p1#1", "p1.4", [K3_LAST], OK, keys=keys(K3_LAST))
    s.poll("rc#1", [K1_OLD, K2_OLD, K1_LAST, K2_DELETE, K3_LAST])
    s.poll("ru#1", [K1_OLD, K2_OLD, K1_LAST, K1_ABORTED, K2_DELETE, K3_LAST], READ_UNCOMMITTED)
    if extra is not None:
        extra(s)
    s.finals(
        CLEANED if committed is None else committed,
        CLEANED if uncommitted is None else uncommitted,
        ENDS,
    )
    return s


def kinds(result: CheckResult) -> set[str]:
    return {a.kind for a in result.anomalies}


def found(result: CheckResult, kind: str) -> list[dict[str, Any]]:
    return [a.to_json() for a in result.anomalies if a.kind == kind]


def test_a_cleaned_log_passes_and_the_cleaning_is_counted() -> None:
    result = check(compacted().ops)
    assert result.valid, [a.to_json() for a in result.anomalies]
    stats = result.stats
    assert (stats["keys"], stats["keys_checked"], stats["keys_deleted"]) == (3, 3, 1)
    assert stats["tombstones_written"] == 1
    assert (stats["cleaned_superseded"], stats["cleaned_aborted"]) == (2, 1)
    assert stats["cleaned_tombstones"] == 1


def test_a_log_not_cleaned_yet_passes_too() -> None:
    everything = [K1_OLD, K2_OLD, K1_LAST, K2_DELETE, K3_LAST]
    uncommitted = [K1_OLD, K2_OLD, K1_LAST, K1_ABORTED, K2_DELETE, K3_LAST]
    result = check(compacted(committed=everything, uncommitted=uncommitted).ops)
    assert result.valid, [a.to_json() for a in result.anomalies]


def test_the_same_removals_on_a_topic_that_is_not_compacted_are_lost_writes() -> None:
    result = check(compacted(policy={"cleanup.policy": "delete"}).ops)
    lost = found(result, "lost-write")
    assert {x["txn"] for x in lost} == {"p1.1", "p1.3", "p2.1"}  # p2.1: missing from the log
    assert "last-value-lost" not in kinds(result)


def test_last_value_lost_when_the_last_committed_value_is_gone() -> None:
    result = check(compacted(committed=[K1_OLD, K3_LAST], uncommitted=[K1_OLD, K3_LAST]).ops)
    assert kinds(result) == {"last-value-lost", "lost-write"}
    [lost] = found(result, "last-value-lost")
    assert (lost["key"], lost["value"], lost["offset"]) == ("k1", K1_LAST[3], 2)
    assert lost["final"] == [0, K1_OLD[3]]  # a stale value instead


def test_last_value_lost_when_a_deleted_key_comes_back() -> None:
    """The tombstone went, but the value it deleted is still there: only this check sees it
    (the tombstone may go, and the old value was committed once)."""
    back = [K2_OLD, *CLEANED]
    result = check(compacted(committed=back, uncommitted=back).ops)
    [lost] = found(result, "last-value-lost")
    assert kinds(result) == {"last-value-lost"}
    assert (lost["key"], lost["tombstone"], lost["final"]) == ("k2", True, [0, K2_OLD[3]])


def test_last_value_lost_when_the_excuse_is_gone_too() -> None:
    """k3's value is superseded by a write of unknown outcome: whether it committed or not,
    one of the two must be there. lost-write excuses the first (superseded); this does not."""
    later: Placed = (K, 0, 8, "p3.1.k3.0")

    def unknown_overwrite(s: Scenario) -> None:
        s.txn("p3#1", "p3.1", [later], UNKNOWN, keys=keys(later))

    ends = [K1_LAST]
    result = check(compacted(committed=ends, uncommitted=ends, extra=unknown_overwrite).ops)
    assert kinds(result) == {"last-value-lost"}
    [lost] = found(result, "last-value-lost")
    assert (lost["key"], lost["value"], lost["final"]) == ("k3", K3_LAST[3], None)
    # Either outcome of the overwrite is fine when the log shows it.
    for final in ([K1_LAST, K3_LAST], [K1_LAST, later]):
        valid = compacted(committed=final, uncommitted=final, extra=unknown_overwrite)
        assert check(valid.ops).valid


def test_a_tombstone_of_unknown_outcome_may_have_deleted_the_key() -> None:
    maybe: Placed = (K, 0, 8, "p3.1.k3.0.tombstone")

    def unknown_delete(s: Scenario) -> None:
        s.txn("p3#1", "p3.1", [maybe], UNKNOWN, keys=keys(maybe))

    result = check(compacted(committed=[K1_LAST], uncommitted=[K1_LAST], extra=unknown_delete).ops)
    assert result.valid, [a.to_json() for a in result.anomalies]


def test_an_aborted_value_visible_after_cleaning() -> None:
    """The cleaner dropped the abort marker but kept the aborted value."""
    result = check(compacted(committed=[K1_LAST, K1_ABORTED, K3_LAST]).ops)
    # rc#1, which rightly skipped it, now looks as if it skipped a committed record.
    assert kinds(result) == {"aborted-read", "poll-skip"}
    [read] = found(result, "aborted-read")
    assert (read["reader"], read["value"], read["offset"]) == ("final-rc", K1_ABORTED[3], 4)


def test_offset_changed() -> None:
    moved: Placed = (K, 0, 1, K1_LAST[3])  # read at 2 while it happened, at 1 at the end
    result = check(compacted(committed=[moved, K3_LAST], uncommitted=[moved, K3_LAST]).ops)
    assert kinds(result) == {"offset-changed"}
    changed = found(result, "offset-changed")
    assert [(c["value"], c["offset"]) for c in changed] == [(K1_LAST[3], 1)]
    assert set(changed[0]["before"]) == {f"{K}-0:2"}
    # Twice in the final passes is a duplicate, as on any topic.
    twice = [K1_LAST, moved, K3_LAST]
    result = check(compacted(committed=twice, uncommitted=twice).ops)
    assert "duplicate" in kinds(result) and "offset-changed" not in kinds(result)


def test_a_reader_that_passed_a_superseded_value_did_not_see_a_torn_transaction() -> None:
    """A read_committed reader that came late saw k2's value of p1.1 but not k1's, already
    cleaned: not torn, since the cleaner may remove it."""

    def late_reader(s: Scenario) -> None:
        s.poll("rc#2", [K2_OLD, K1_LAST, K3_LAST], READ_COMMITTED)

    assert check(compacted(extra=late_reader).ops).valid
