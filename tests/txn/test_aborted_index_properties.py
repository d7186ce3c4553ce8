"""Property tests of the aborted-transaction index against realistic transaction histories.

Histories come from a ProducerStateManager driven with random transactional appends, commits
and aborts, so the recorded last stable offsets are the ones the broker would write.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.txn.producer_log import T0, data, marker_header

from onceflow.clock import ManualClock
from onceflow.log.aborted_index import ENTRY_SIZE, AbortedTxnIndex, txn_index_file
from onceflow.log.producer_state import CompletedTxn, ProducerStateManager

# (producer, action): 0 = append a transactional batch, 1 = commit, 2 = abort
_steps = st.lists(
    st.tuples(st.integers(1, 4), st.sampled_from([0, 0, 1, 2]), st.integers(1, 5)),
    max_size=60,
)


def _history(steps: list[tuple[int, int, int]]) -> tuple[list[CompletedTxn], int]:
    psm = ProducerStateManager(ManualClock(T0))
    seqs: dict[int, int] = {}
    completed = []
    end = 0
    for pid, action, count in steps:
        if action == 0:
            header = replace(data(pid, 0, seqs.get(pid, 0), count, txn=True), base_offset=end)
            psm.on_append(header)
            seqs[pid] = seqs.get(pid, 0) + count
            end = header.next_offset
        else:
            done = psm.on_marker(marker_header(end, pid, 0, T0), action == 1, 0)
            end += 1
            if done is not None:
                completed.append(done)
    return completed, end


def _brute_force(entries: list[CompletedTxn], fetch: int, upper: int) -> list[tuple[int, int]]:
    return [
        (t.producer_id, t.first_offset)
        for t in entries
        if t.is_aborted and t.last_offset >= fetch and t.first_offset < upper
    ]


@settings(max_examples=150, deadline=None)
@given(_steps, st.data(), st.integers(1, 6))
def test_collect_matches_a_scan_of_every_entry(
    steps: list[tuple[int, int, int]], draw: st.DataObject, segments: int
) -> None:
    completed, end = _history(steps)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for base in sorted({0, *draw.draw(st.lists(st.integers(0, end), max_size=segments))}):
            (directory / f"{base:020d}.log").touch()
        index = AbortedTxnIndex.open(directory)
        for done in completed:
            index.add(done)
        for _ in range(10):
            fetch = draw.draw(st.integers(0, end + 1))
            upper = draw.draw(st.integers(fetch, end + 2))
            assert index.collect(fetch, upper) == _brute_force(completed, fetch, upper)
        index.close()
        reopened = AbortedTxnIndex.open(directory)
        assert reopened.entries() == index.entries()
        assert reopened.collect(0, end + 1) == _brute_force(completed, 0, end + 1)


@settings(max_examples=40, deadline=None)
@given(_steps, st.data())
def test_recovery_by_truncation_and_replay_restores_the_index(
    steps: list[tuple[int, int, int]], draw: st.DataObject
) -> None:
    completed, end = _history(steps)
    cut = draw.draw(st.integers(0, end))
    with tempfile.TemporaryDirectory() as tmp:
        index = AbortedTxnIndex.open(Path(tmp))
        for done in completed:
            index.add(done)
        expected = index.entries()
        index.truncate_after(cut)
        assert all(t.last_offset < cut for t in index.entries())
        for done in completed:  # the replay of the log from `cut` on reports them again
            if done.last_offset >= cut:
                index.add(done)
        assert index.entries() == expected


def test_a_cut_at_every_byte_keeps_the_whole_entries() -> None:
    completed, _ = _history([(1, 0, 2), (2, 0, 1), (1, 2, 1), (2, 2, 1)] * 5)
    aborted = [t for t in completed if t.is_aborted]
    assert len(aborted) >= 4
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        index = AbortedTxnIndex.open(directory)
        for done in aborted:
            index.add(done)
        index.close()
        path = txn_index_file(directory, 0)
        full = path.read_bytes()
        for cut in range(len(full) + 1):
            path.write_bytes(full[:cut])
            reopened = AbortedTxnIndex.open(directory)
            assert reopened.entries() == index.entries()[: cut // ENTRY_SIZE]
            reopened.close()
