"""The cleaner's filter on hand-written histories: Kafka's LogCleaner rules one by one."""

from __future__ import annotations

import pytest

from onceflow.compaction import (
    CleanRangeError,
    LastRecord,
    OffsetMap,
    clean_segments,
    last_records_of_producers,
)
from onceflow.compaction.cleaner import delete_horizon_ms
from onceflow.log.producer_state import ProducerStateManager
from onceflow.records.batch import DELETE_HORIZON_FLAG, iter_batches, parse_header
from onceflow.records.record import decode_batch, iter_decoded_batches
from tests.compaction.history import (
    History,
    all_batches,
    apply,
    check_valid,
    more,
    records_of,
)

MAP = 64 * 1024  # a small offset map: tests do not need Kafka's 128 MiB


def clean(history_or_segments, *, first_dirty=0, upper=None, now=10_000, retention=1_000, **kw):  # type: ignore[no-untyped-def]
    if isinstance(history_or_segments, History):
        segments = history_or_segments.segment_batches()
        aborted = history_or_segments.aborted
    else:
        segments, aborted = history_or_segments, kw.pop("aborted", [])
    if upper is None:
        upper = segments[-1].base_offset  # everything but the active segment
    last_records = kw.pop(
        "last_records",
        last_records_of_producers(parse_header(b) for b in all_batches(segments)),
    )
    offset_map = kw.pop("offset_map", None)
    result = clean_segments(
        segments,
        first_dirty_offset=first_dirty,
        first_uncleanable_offset=upper,
        aborted=kw.pop("aborted", aborted),
        last_records=last_records,
        now_ms=now,
        delete_retention_ms=retention,
        offset_map=offset_map if offset_map is not None else OffsetMap(MAP),
        **kw,
    )
    for group in result.groups:
        check_valid(group.batches)
    return result, apply(segments, result)


def survivors(segments) -> list[tuple[int, bytes | None, bytes | None]]:  # type: ignore[no-untyped-def]
    return [(r.offset, r.key, r.value) for r in records_of(all_batches(segments))]


def test_keeps_the_latest_record_of_each_key_and_offsets_do_not_move() -> None:
    h = History()
    h.data([(b"a", b"1"), (b"b", b"1")])
    h.data([(b"a", b"2")])
    h.roll()
    h.data([(b"c", b"1"), (b"b", b"2")])
    h.data([(b"a", b"3")])
    h.roll()
    h.data([(b"a", b"4")])  # active segment: never cleaned
    result, after = clean(h)
    assert result.end_offset == 6
    assert survivors(after) == [(3, b"c", b"1"), (4, b"b", b"2"), (5, b"a", b"3"), (6, b"a", b"4")]
    # the emptied batch [0, 1] is gone; the surviving batches keep their base offsets
    bases = [parse_header(b).base_offset for b in all_batches(after)]
    assert bases == [3, 5, 6]


def test_a_batch_whose_records_all_stay_is_copied_byte_for_byte() -> None:
    h = History()
    h.data([(b"a", b"1")])
    kept = h.data([(b"b", b"1"), (b"c", b"1")], compression=1)
    h.data([(b"a", b"2")])
    h.roll()
    h.data([(b"z", b"1")])
    _, after = clean(h)
    assert kept in all_batches(after)


def test_a_partly_cleaned_batch_keeps_producer_fields_and_last_offset_delta() -> None:
    h = History()
    h.data([(b"a", b"1"), (b"b", b"1"), (b"c", b"1")], producer_id=5, producer_epoch=3)
    h.data([(b"c", b"2")], producer_id=6)
    h.roll()
    h.data([(b"z", b"1")])
    before = parse_header(h.segments[0][0])
    _, after = clean(h)
    cleaned = decode_batch(all_batches(after)[0])
    assert [r.offset for r in cleaned.records] == [0, 1]
    header = cleaned.header
    assert (header.base_offset, header.last_offset_delta) == (0, 2)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (5, 3, 0)
    assert header.last_sequence == before.last_sequence == 2
    assert header.records_count == 2


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_compressed_batches_are_rewritten_with_their_codec(codec: int) -> None:
    h = History()
    h.data([(b"k%d" % i, b"v" * 50) for i in range(20)], compression=codec)
    h.data([(b"k%d" % i, b"w") for i in range(0, 20, 2)], compression=codec)
    h.roll()
    h.data([(b"z", b"1")])
    _, after = clean(h)
    first = decode_batch(all_batches(after)[0])
    assert first.header.compression == codec
    assert [r.key for r in first.records] == [b"k%d" % i for i in range(1, 20, 2)]
    assert [r.value for r in first.records] == [b"v" * 50] * 10


def test_tombstones_stay_until_their_delete_horizon_then_go() -> None:
    h = History()
    h.data([(b"a", b"1"), (b"b", b"1")])
    h.data([(b"a", None)])  # tombstone
    h.roll()
    h.data([(b"z", b"1")])
    # first round at t=10 000 with delete.retention.ms 1 000: the tombstone stays, and its
    # batch now carries the delete horizon 11 000
    result, after = clean(h, now=10_000, retention=1_000)
    assert survivors(after) == [(1, b"b", b"1"), (2, b"a", None), (3, b"z", b"1")]
    tombstone_batch = parse_header(all_batches(after)[1])
    assert tombstone_batch.attributes & DELETE_HORIZON_FLAG
    assert delete_horizon_ms(tombstone_batch) == 11_000
    # the record's own timestamp is unchanged (base timestamp is the horizon, deltas follow)
    assert decode_batch(all_batches(after)[1]).records[0].timestamp == 1_002
    # a later round before the horizon: still there
    after = more(after)
    _, later = clean(after, first_dirty=result.end_offset, now=10_999, retention=1_000)
    assert (2, b"a", None) in survivors(later)
    # at the horizon: gone
    _, final = clean(after, first_dirty=result.end_offset, now=11_000, retention=1_000)
    assert survivors(final) == [(1, b"b", b"1"), (3, b"z", b"1"), (4, b"new", b"1")]


def test_keyless_records_are_dropped_in_the_cleaned_range_as_kafka_does() -> None:
    h = History()
    h.data([(None, b"x"), (b"a", b"1")])
    h.roll()
    h.data([(None, b"y")])
    result, after = clean(h)
    assert survivors(after) == [(1, b"a", b"1"), (2, None, b"y")]
    assert result.stats.invalid_records == 1


def test_aborted_records_go_committed_stay_and_markers_wait_for_their_data_and_horizon() -> None:
    h = History()
    h.data([(b"a", b"c1"), (b"b", b"c1")], producer_id=1, transactional=True)  # 0, 1
    h.end_txn(1, commit=True)  # 2
    h.data([(b"a", b"x1"), (b"c", b"x1")], producer_id=2, transactional=True)  # 3, 4
    h.end_txn(2, commit=False)  # 5
    h.roll()
    h.data([(b"q", b"1")], producer_id=3)  # 6, active
    no_producers: dict[int, LastRecord] = {}  # all expired: no batch kept for producer state
    result, after = clean(h, last_records=no_producers, now=1_000, retention=100)
    assert survivors(after) == [(0, b"a", b"c1"), (1, b"b", b"c1"), (6, b"q", b"1")]
    markers = [parse_header(b) for b in all_batches(after) if parse_header(b).is_control]
    # both markers stay: the COMMIT's data is there, the ABORT's data was still seen this round
    assert [m.base_offset for m in markers] == [2, 5]
    assert not any(m.attributes & DELETE_HORIZON_FLAG for m in markers)
    (group,) = result.groups
    assert [(t.producer_id, t.first_offset, t.last_offset) for t in group.aborted] == [(2, 3, 5)]

    # second round: the ABORT's data is gone, so its marker may go once its horizon passes
    result2, after2 = clean(
        more(after), first_dirty=6, last_records=no_producers, now=2_000, retention=100
    )
    markers = [parse_header(b) for b in all_batches(after2) if parse_header(b).is_control]
    assert [m.base_offset for m in markers] == [2, 5]
    assert delete_horizon_ms(markers[1]) == 2_100 and delete_horizon_ms(markers[0]) is None
    assert result2.groups[0].aborted == []  # no data left: no index entry needed

    _, after3 = clean(
        more(after2), first_dirty=7, last_records=no_producers, now=2_100, retention=100
    )
    markers = [parse_header(b) for b in all_batches(after3) if parse_header(b).is_control]
    assert [m.base_offset for m in markers] == [2]


def test_a_commit_marker_goes_once_its_transaction_data_was_all_superseded() -> None:
    h = History()
    h.data([(b"a", b"1")], producer_id=1, transactional=True)  # 0
    h.end_txn(1, commit=True)  # 1
    h.data([(b"a", b"2")])  # 2
    h.roll()
    h.data([(b"z", b"1")])  # 3
    _, after = clean(h, last_records={}, now=100, retention=10)
    # the data went this round; the marker saw none of its data? It did (offset 0 was read):
    # kept without a horizon. Next round it is discardable and gets one, then goes.
    kinds = [(parse_header(b).base_offset, parse_header(b).is_control) for b in all_batches(after)]
    assert kinds == [(1, True), (2, False), (3, False)]
    _, after2 = clean(more(after), first_dirty=3, last_records={}, now=200, retention=10)
    assert delete_horizon_ms(parse_header(all_batches(after2)[0])) == 210
    _, after3 = clean(more(after2), first_dirty=4, last_records={}, now=210, retention=10)
    assert [parse_header(b).base_offset for b in all_batches(after3)] == [2, 3, 4, 5]


def test_the_last_batch_of_each_producer_stays_empty_with_its_sequence() -> None:
    h = History()
    h.data([(b"a", b"1"), (b"b", b"1")], producer_id=7, producer_epoch=2)  # 0-1 seq 0-1
    h.data([(b"a", b"2"), (b"b", b"2")], producer_id=7, producer_epoch=2)  # 2-3 seq 2-3
    h.data([(b"a", b"3"), (b"b", b"3")])  # 4-5, no producer id
    h.data([(b"c", b"1")])  # 6
    h.roll()
    h.data([(b"z", b"1")])
    original = [parse_header(b) for b in all_batches(h.segment_batches())]
    _, after = clean(h)
    batches = [parse_header(b) for b in all_batches(after)]
    # the producer's first batch is gone, its last one stays as an empty batch
    assert [(b.base_offset, b.records_count) for b in batches] == [(2, 0), (4, 2), (6, 1), (7, 1)]
    empty = batches[0]
    assert (empty.producer_id, empty.producer_epoch, empty.base_sequence) == (7, 2, 2)
    assert empty.last_offset == 3 and empty.last_sequence == 3
    assert empty.max_timestamp == original[1].max_timestamp
    # producer state rebuilt from the cleaned log is the one rebuilt from the original log
    assert _replayed(all_batches(after)) == _replayed(all_batches(h.segment_batches()))


def _replayed(batches: list[bytes]):  # type: ignore[no-untyped-def]
    state = ProducerStateManager(clock=lambda: 0)  # type: ignore[arg-type]
    for batch in batches:
        state.replay(parse_header(batch))
    return [(p.producer_id, p.producer_epoch, p.last_sequence) for p in state.producers()]


def test_the_last_batch_before_the_upper_bound_stays_even_empty() -> None:
    h = History()
    h.data([(b"a", b"1")])  # 0
    h.data([(b"a", b"2")])  # 1
    h.data([(b"a", b"3")])  # 2: only a tombstone-free update, so 1 goes... and 0
    h.data([(None, b"k")])  # 3: keyless, dropped, but the last batch below the bound
    h.roll()
    h.data([(b"z", b"1")])
    _, after = clean(h)
    batches = [parse_header(b) for b in all_batches(after)]
    assert [(b.base_offset, b.records_count) for b in batches] == [(2, 1), (3, 0), (4, 1)]


def test_offset_map_full_cleans_up_to_the_offset_reached_then_the_rest() -> None:
    h = History()
    for i in range(40):
        h.data([(b"k%d" % (i % 30), b"%d" % i)])
        if i % 10 == 9:
            h.roll()
    h.roll()
    h.data([(b"z", b"z")])
    small = OffsetMap(24 * 12, load_factor=0.9)  # 12 slots, 10 entries
    assert small.capacity == 10
    result, after = clean(h, offset_map=small)
    assert result.end_offset == 10  # keys k0..k9 mapped, k10 did not fit
    # only segments starting below the offset reached were cleaned: nothing moved yet since
    # k0..k9 are not repeated below offset 10
    assert [g.replaces for g in result.groups] == [[0]]
    assert survivors(after) == survivors(h.segment_batches())
    # next rounds continue from where the last stopped, until the whole log is done
    first_dirty = result.end_offset
    while first_dirty < 40:
        result, after = clean(after, first_dirty=first_dirty, upper=40, offset_map=small)
        assert result.end_offset > first_dirty
        first_dirty = result.end_offset
    expected = {}
    for offset, key, value in survivors(h.segment_batches()):
        expected[key] = (offset, key, value)
    assert survivors(after) == sorted(expected.values())


def test_batches_at_or_past_the_first_uncleanable_offset_are_refused() -> None:
    h = History()
    h.data([(b"a", b"1")])
    h.data([(b"a", b"2")])
    with pytest.raises(CleanRangeError):
        clean(h, upper=1)


def test_a_corrupt_batch_is_refused_not_rewritten() -> None:
    h = History()
    h.data([(b"a", b"1")])
    bad = bytearray(h.data([(b"a", b"2"), (b"b", b"1")]))
    bad[-1] ^= 0xFF
    h.segments[0][1] = bytes(bad)
    h.roll()
    h.data([(b"z", b"1")])
    from onceflow.records.errors import CorruptRecordError

    with pytest.raises(CorruptRecordError):
        clean(h)


def test_an_open_transaction_is_never_touched() -> None:
    # the planner never lets the round reach the open transaction (see test_cleanable); and
    # a transaction without a marker below the bound is never treated as aborted
    h = History()
    h.data([(b"a", b"1")], producer_id=1, transactional=True)  # 0: no marker yet
    h.data([(b"b", b"1")])
    h.roll()
    h.data([(b"z", b"1")])
    _, after = clean(h)
    assert survivors(after) == survivors(h.segment_batches())
    assert all_batches(after) == all_batches(h.segment_batches())


def test_cleaned_output_walks_as_one_log() -> None:
    h = History()
    for i in range(30):
        h.data([(b"k%d" % (i % 4), b"%d" % i), (b"j%d" % (i % 3), None)], compression=i % 5)
        if i % 7 == 6:
            h.roll()
    h.roll()
    h.data([(b"z", b"1")])
    _, after = clean(h)
    buf = b"".join(all_batches(after))
    assert len(list(iter_batches(buf, verify_crc=True))) == len(all_batches(after))
    assert list(iter_decoded_batches(buf))


def test_records_past_what_the_full_map_covers_are_all_kept() -> None:
    h = History()
    h.data([(b"a", b"1"), (b"b", b"1"), (b"c", b"1")])  # 0-2: the map fills at c
    h.data([(None, b"x"), (b"a", None)])  # 3-4: keyless and a tombstone, both past the map
    h.roll()
    h.data([(b"z", b"1")])
    small = OffsetMap(24 * 3, load_factor=0.9)  # 2 entries
    result, after = clean(h, offset_map=small, now=10, retention=0)
    assert result.end_offset == 2  # a and b mapped (the put of b set the latest offset)
    assert survivors(after) == survivors(h.segment_batches())


def test_last_records_from_live_producer_state_match_a_walk_of_the_log() -> None:
    from onceflow.compaction.producers import last_records_from_state

    h = History()
    h.data([(b"a", b"1")], producer_id=1, producer_epoch=0)
    h.data([(b"b", b"1")], producer_id=2, transactional=True)
    h.end_txn(2, commit=True)
    h.data([(b"c", b"1")], producer_id=1, producer_epoch=0)
    h.data([(b"d", b"1")], producer_id=3, transactional=True)
    h.end_txn(3, commit=False, producer_epoch=1)  # an abort on fencing bumps the epoch
    batches = all_batches(h.segment_batches())
    state = ProducerStateManager(clock=lambda: 0)  # type: ignore[arg-type]
    for batch in batches:
        header = parse_header(batch)
        if header.is_control:
            from onceflow.records.control import ControlType, parse_control_record

            kind, epoch = parse_control_record(decode_batch(batch).records[0])
            state.replay(header, (kind == ControlType.COMMIT, epoch))
        else:
            state.replay(header)
    walked = last_records_of_producers(parse_header(b) for b in batches)
    assert last_records_from_state(state) == walked
    assert walked == {1: LastRecord(3, 0), 2: LastRecord(1, 0), 3: LastRecord(None, 1)}
