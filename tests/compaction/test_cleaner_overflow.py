"""The cleaner's arithmetic on settings and timestamps never leaves the int64 range (issue 19,
item 3): `delete.retention.ms=9223372036854775807`, which Kafka accepts, made every round of the
partition fail with "does not fit a varlong" (now + retention as a batch's base timestamp), and
records stamped near the int64 bounds did the same with any retention."""

from __future__ import annotations

from onceflow.compaction.cleaner import delete_horizon_ms
from onceflow.records.batch import DELETE_HORIZON_FLAG, parse_header
from onceflow.records.builder import build_batch
from onceflow.records.varint import INT64_MAX, INT64_MIN
from tests.compaction.history import History, all_batches, more, records_of
from tests.compaction.test_cleaner import clean

NOW_MS = 1_760_000_000_000


def timestamps(segments) -> dict[int, int]:  # type: ignore[no-untyped-def]
    return {r.offset: r.timestamp for r in records_of(all_batches(segments))}


def tombstone_batch(segments):  # type: ignore[no-untyped-def]
    [found] = [
        parse_header(b)
        for b in all_batches(segments)
        if any(r.value is None for r in records_of([b]))
    ]
    return found


def test_delete_retention_ms_max_keeps_tombstones_forever() -> None:
    h = History()
    h.data([(b"a", b"1"), (b"b", b"1")])
    h.data([(b"a", None)])  # tombstone
    h.roll()
    h.data([(b"c", b"1")])
    _, after = clean(h, now=NOW_MS, retention=INT64_MAX)
    # The horizon saturates at Long.MAX_VALUE: "forever" still, and the batch is valid (clean
    # checks every output batch's CRC and decodes it).
    header = tombstone_batch(after)
    assert header.attributes & DELETE_HORIZON_FLAG
    assert delete_horizon_ms(header) == INT64_MAX
    assert timestamps(after)[2] == h.timestamp - 1  # the tombstone keeps its own timestamp
    # A round far in the future still keeps it, and copies its batch as it is.
    _, again = clean(more(after), now=INT64_MAX - 1, retention=INT64_MAX)
    assert [r.key for r in records_of(all_batches(again)) if r.value is None] == [b"a"]
    assert delete_horizon_ms(tombstone_batch(again)) == INT64_MAX


def test_a_tombstone_stamped_near_the_int64_minimum_gets_a_horizon_that_fits() -> None:
    h = History()
    stamp = INT64_MIN + 5  # stored as produced: Kafka's default timestamp checks allow it
    h.append(build_batch([(b"a", None, (), stamp)], base_offset=h.next_offset))
    h.roll()
    h.data([(b"c", b"1")])
    _, after = clean(h, now=NOW_MS, retention=1_000)
    # now + 1 s as the base would make the record's delta overflow: the horizon saturates at
    # the largest base its timestamp can be expressed from (stamp + 2^63), the timestamp stays.
    assert delete_horizon_ms(tombstone_batch(after)) == 5
    assert timestamps(after)[0] == stamp
    # that horizon has passed: the next round drops the tombstone
    _, later = clean(more(after), now=NOW_MS + 1, retention=1_000)
    assert all(r.value is not None for r in records_of(all_batches(later)))


def test_a_batch_spanning_the_int64_range_is_rebuilt_from_its_own_base_timestamp() -> None:
    h = History()
    # base timestamp 0: deltas Long.MIN_VALUE and Long.MAX_VALUE both fit
    h.append(
        build_batch(
            [(b"a", b"1", (), INT64_MIN), (b"b", b"1", (), 0), (b"c", b"1", (), INT64_MAX)],
            base_timestamp=0,
        )
    )
    h.data([(b"b", b"2")])  # supersedes offset 1: the first batch is rebuilt without it
    h.roll()
    h.data([(b"d", b"1")])
    _, after = clean(h, now=NOW_MS)
    # Kafka's base (the first kept record's timestamp) would need a delta of 2^64 - 1
    first = parse_header(all_batches(after)[0])
    assert first.base_timestamp == 0
    assert timestamps(after) == {0: INT64_MIN, 2: INT64_MAX, 3: h.timestamp - 1, 4: h.timestamp}
