"""The checker in linear time: what a consumer's gaps may pass over is indexed once per
session, and the findings are those of the old checker, which built that index anew for each
gap (generated histories with planted anomalies, compared anomaly by anomaly)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.verify.checker import Checker, check
from onceflow.verify.history import READ_COMMITTED, READ_UNCOMMITTED, TopicPartition
from onceflow.verify.indexed_history import Session
from tests.verify.synthetic import Shape, generate


class QuadraticChecker(Checker):
    """The checker before the fix: `torn | read` built for every gap of every session."""

    def _sessions(self) -> None:
        expected = {
            READ_COMMITTED: self._sorted(self.final_rc),
            READ_UNCOMMITTED: self._sorted(self.final_ru),
        }
        for session in self.model.sessions.values():
            last: dict[TopicPartition, int] = {}
            torn: dict[str, str] = {}
            if session.isolation == READ_COMMITTED and session.process not in self.final_processes:
                torn = self._torn_in_session(session)
            read = {value: "" for *_, value in session.records}
            for t, p, o, value in session.records:
                tp = (t, p)
                previous = last.get(tp, -1)
                if tp in last and o <= previous:
                    self.flag(
                        "nonmonotonic-poll",
                        f"{session.process} got {t}-{p}:{o} after offset {previous}",
                        topic=t,
                        partition=p,
                        offset=o,
                        reader=session.process,
                        previous_offset=previous,
                        value=value,
                    )
                elif o > previous + 1:
                    self._skip(session, tp, previous, o, expected[session.isolation], torn | read)  # type: ignore[arg-type]
                last[tp] = max(previous, o)


def findings(checker: Checker) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    result = checker.run()
    return [a.to_json() for a in result.anomalies], result.stats


shapes = st.builds(
    Shape,
    committed=st.integers(5, 60),
    aborted=st.integers(0, 25),
    partitions=st.integers(1, 3),
    producers=st.integers(1, 3),
    max_writes=st.integers(1, 4),
    readers=st.integers(1, 2),
    uncommitted_readers=st.integers(0, 1),
    copied_partitions=st.integers(0, 1),
    poll_size=st.integers(2, 20),
    anomalies=st.integers(0, 8),
)


@settings(max_examples=60, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_findings_are_the_old_checkers(shape: Shape, seed: int) -> None:
    ops = generate(shape, seed)
    assert findings(Checker(ops)) == findings(QuadraticChecker(ops))


def test_planted_anomalies_are_found_alike() -> None:
    """The comparison is not vacuous: planted anomalies give the kinds a consumer's gaps
    produce, and both checkers report the same ones."""
    kinds: set[str] = set()
    for seed in range(12):
        ops = generate(Shape(committed=80, aborted=30, partitions=2, anomalies=10), seed)
        new, old = findings(Checker(ops)), findings(QuadraticChecker(ops))
        assert new == old
        kinds |= {a["kind"] for a in new[0]}
    assert {"poll-skip", "torn-transaction", "nonmonotonic-poll", "phantom-read"} <= kinds


def test_a_generated_history_without_anomalies_passes() -> None:
    result = check(generate(Shape(committed=300, aborted=100, readers=2), seed=7))
    assert result.valid, [a.to_json() for a in result.anomalies[:5]]
    assert result.stats["aborted"] == 100


def test_gaps_share_one_index_per_session(monkeypatch: Any) -> None:
    """Each gap a consumer's offsets jump (a commit marker, an aborted batch) is judged
    against one index of the session's values, not a copy made for that gap: the copies made
    a 1-hour run's check grow with gaps x records (25 minutes and counting)."""
    seen: dict[str, list[object]] = {}  # kept alive, so that no two share an id()
    skip = Checker._skip

    def spy(self: Checker, session: Session, *args: Any) -> None:
        seen.setdefault(session.process, []).append(args[-1])
        skip(self, session, *args)

    monkeypatch.setattr(Checker, "_skip", spy)
    result = check(generate(Shape(committed=200, aborted=80, readers=2), seed=3))
    assert result.valid
    assert min(len(indexes) for indexes in seen.values()) > 50
    distinct = {process: len({id(x) for x in indexes}) for process, indexes in seen.items()}
    assert distinct == dict.fromkeys(seen, 1)
