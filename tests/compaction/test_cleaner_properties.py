"""Property test of the cleaner: random keyed histories with idempotent and transactional
producers, commits, aborts, open transactions, tombstones and every codec, cleaned once and
then again past the delete horizon, against the model "last committed value per key"."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.compaction import (
    CompactedLog,
    OffsetMap,
    SegmentInfo,
    clean_segments,
    last_records_of_producers,
    log_to_clean,
)
from onceflow.compaction.offset_map import BYTES_PER_ENTRY
from onceflow.records.batch import parse_header
from onceflow.records.record import Record
from tests.compaction.history import History, all_batches, apply, check_valid, more, records_of

PRODUCERS = (None, 1, 10, 11)  # plain, idempotent, two transactional
TRANSACTIONAL = (10, 11)
KEYS = [b"k%d" % i for i in range(6)]

op = st.one_of(
    st.tuples(
        st.just("put"),
        st.sampled_from(PRODUCERS),
        st.lists(st.tuples(st.sampled_from(KEYS), st.booleans()), min_size=1, max_size=4),
        st.integers(0, 4),
    ),
    st.tuples(st.sampled_from(["commit", "abort"]), st.sampled_from(TRANSACTIONAL)),
    st.tuples(st.just("roll")),
)


def build(ops: list[tuple]) -> History:  # type: ignore[type-arg]
    h = History()
    for n, item in enumerate(ops):
        if item[0] == "put":
            _, producer, records, codec = item
            values = [(k, None if tombstone else b"v%d" % n) for k, tombstone in records]
            if producer is None:
                h.data(values, compression=codec)
            else:
                h.data(
                    values,
                    producer_id=producer,
                    transactional=producer in TRANSACTIONAL,
                    compression=codec,
                )
        elif item[0] == "roll":
            h.roll()
        elif item[1] in h.open_txns:
            h.end_txn(item[1], commit=item[0] == "commit")
    h.roll()
    h.data([(b"active", b"1")])
    return h


def fold(records: list[Record], aborted: set[int]) -> dict[bytes | None, bytes]:
    """What a read_committed consumer materialises: last value per key, tombstones delete."""
    state: dict[bytes | None, bytes] = {}
    for r in records:
        if r.offset in aborted:
            continue
        if r.value is None:
            state.pop(r.key, None)
        else:
            state[r.key] = r.value
    return state


def first_uncleanable(h: History, segments) -> int:  # type: ignore[no-untyped-def]
    """The planner's bound: below the active segment and the first open transaction."""
    infos = [SegmentInfo(s.base_offset, sum(len(b) for b in s.batches), 0, 0) for s in segments]
    open_firsts = [offsets[0] for offsets in h.open_txns.values() if offsets]
    end = parse_header(all_batches(segments)[-1]).next_offset
    lso = min([*open_firsts, end])
    log = CompactedLog(infos, log_start_offset=0, log_end_offset=end, last_stable_offset=lso)
    candidate, _ = log_to_clean(log, None, 0)
    return candidate.first_uncleanable_offset


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(op, max_size=40), map_entries=st.sampled_from([3, 8, 1000]))
def test_cleaning_keeps_the_committed_state_and_every_surviving_offset(
    ops: list[tuple],  # type: ignore[type-arg]
    map_entries: int,
) -> None:
    h = build(ops)
    segments = h.segment_batches()
    original = {r.offset: r for r in h.records()}
    upper = first_uncleanable(h, segments)
    last_records = last_records_of_producers(parse_header(b) for b in all_batches(segments))
    offset_map = OffsetMap(BYTES_PER_ENTRY * (map_entries + 1), load_factor=0.9999)

    result = clean_segments(
        segments,
        first_dirty_offset=0,
        first_uncleanable_offset=upper,
        aborted=h.aborted,
        last_records=last_records,
        now_ms=5_000,
        delete_retention_ms=1_000,
        offset_map=offset_map,
    )
    after = apply(segments, result)
    end = result.end_offset
    assert end <= upper
    for group in result.groups:
        check_valid(group.batches)
    check_valid(all_batches(after))
    kept = records_of(all_batches(after))

    # no surviving record moved or changed; nothing at or past the offset reached was touched
    # but aborted data (a decided abort's records go wherever the cleaner meets them, as in
    # Kafka's checkBatchRetention)
    for r in kept:
        assert original[r.offset] == r
    kept_offsets = {r.offset for r in kept}
    assert {o for o in original if o >= end and o not in h.aborted_offsets} <= kept_offsets
    # a read_committed consumer sees the same state
    assert fold(kept, h.aborted_offsets) == fold(list(original.values()), h.aborted_offsets)
    # no aborted record below the offset reached survives
    assert not {o for o in kept_offsets if o < end} & h.aborted_offsets
    # when the map held the whole dirty range: exactly the last record of each key survives
    if end == upper:
        latest: dict[bytes | None, int] = {}
        for r in original.values():
            if r.offset < upper and r.offset not in h.aborted_offsets:
                latest[r.key] = r.offset
        assert {o for o in kept_offsets if o < upper} == set(latest.values())
    # each active producer's last batch is still there, with its producer fields
    headers = {parse_header(b).last_offset: parse_header(b) for b in all_batches(after)}
    before = {parse_header(b).last_offset: parse_header(b) for b in all_batches(segments)}
    for last in last_records.values():
        if last.last_data_offset is not None:
            a, b = headers[last.last_data_offset], before[last.last_data_offset]
            assert (a.producer_id, a.producer_epoch, a.base_sequence, a.last_sequence) == (
                b.producer_id,
                b.producer_epoch,
                b.base_sequence,
                b.last_sequence,
            )

    # a second round past every delete horizon set by the first drops those tombstones
    if end < upper:
        return
    later = more(after, b"later")
    result2 = clean_segments(
        later,
        first_dirty_offset=end,
        first_uncleanable_offset=first_uncleanable(h, later),
        aborted=h.aborted,
        last_records=last_records,
        now_ms=6_000,
        delete_retention_ms=1_000,
        offset_map=OffsetMap(BYTES_PER_ENTRY * 2000),
    )
    if not result2.groups:
        return  # nothing dirty (an open transaction still bounds the log)
    after2 = apply(later, result2)
    check_valid(all_batches(after2))
    kept2 = records_of(all_batches(after2))
    for r in kept2:
        if r.offset in original:
            assert original[r.offset] == r
    assert not [r for r in kept2 if r.offset < end and r.value is None]
    originals = [*original.values(), *records_of(later[-1].batches)]
    assert fold(kept2, h.aborted_offsets) == fold(originals, h.aborted_offsets)
