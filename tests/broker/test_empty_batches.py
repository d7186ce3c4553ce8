"""A log holding batches the cleaner emptied (Kafka's RETAIN_EMPTY: a producer's last data
batch, an emptied control batch) recovers after a crash and serves: producer state keeps the
last sequence and offset of an emptied data batch, an emptied marker only moves the epoch,
reads and ListOffsets by time step over them, and offsets stay where they were."""

from __future__ import annotations

from pathlib import Path

from onceflow.clock import ManualClock
from onceflow.compaction.cleaner import empty_batch
from onceflow.log.config import LogConfig
from onceflow.log.unified_log import UnifiedLog
from onceflow.records.batch import iter_batches
from onceflow.records.builder import build_batch
from onceflow.records.record import iter_decoded_batches

EXPIRATION_MS = 24 * 3600 * 1000


def _open(directory: Path, clock: ManualClock) -> UnifiedLog:
    return UnifiedLog.open("t", 0, directory, LogConfig(), clock, EXPIRATION_MS)


def _append(partition: UnifiedLog, batch: bytes) -> int:
    headers = list(iter_batches(batch))
    info = partition.log.append(batch, headers)
    partition.after_append([h for _, h in info.headers])
    return info.first_offset


def _crash(partition: UnifiedLog) -> None:
    """kill -9: no snapshot, no clean-shutdown marker, descriptors dropped."""
    partition.aborted.close()
    partition.log._abandon()


def test_a_log_with_emptied_batches_recovers_and_serves(tmp_path: Path) -> None:
    clock = ManualClock(1_700_000_000_000)
    directory = tmp_path / "t-0"
    partition = _open(directory, clock)
    ts = clock()
    a = _append(
        partition,
        build_batch(
            [(b"k1", b"a1", (), ts), (b"k2", b"a2", (), ts)],
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
        ),
    )
    b = _append(
        partition,
        build_batch(
            [(b"k1", b"b1", (), ts + 10), (b"k2", b"b2", (), ts + 10), (b"k3", b"b3", (), ts + 10)],
            producer_id=7,
            producer_epoch=0,
            base_sequence=2,
        ),
    )
    t = _append(
        partition,
        build_batch(
            [(b"k4", b"aborted", (), ts + 20)],
            producer_id=8,
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
        ),
    )
    partition.append_marker(8, 1, False, 3, ts + 30)
    m = partition.log.log_end_offset - 1
    c = _append(partition, build_batch([(b"k5", b"c", (), ts + 40)]))
    partition.log.roll()
    d = _append(partition, build_batch([(b"k6", b"d", (), ts + 50)]))
    flush = partition.log.prepare_flush()
    assert flush is not None
    flush.run()
    partition.log.complete_flush(flush)
    end = partition.log.log_end_offset
    _crash(partition)

    # The cleaner's output: pid 7's last batch emptied (its records superseded), the aborted
    # transaction's data removed, and its marker emptied (pid 8's last batch, horizon passed).
    path = directory / f"{0:020d}.log"
    data = path.read_bytes()
    out = bytearray()
    for position, header in iter_batches(data):
        raw = data[position : position + header.size]
        if header.base_offset == t:
            continue
        out += empty_batch(header) if header.base_offset in (b, m) else raw
    path.write_bytes(bytes(out))
    for suffix in (".index", ".timeindex"):
        (directory / f"{0:020d}{suffix}").unlink()
    for snapshot in directory.glob("*.snapshot"):
        snapshot.unlink()
    for txnindex in directory.glob("*.txnindex"):
        txnindex.unlink()  # the cleaned segment's index lists no transaction any more

    recovered = _open(directory, clock)
    try:
        assert recovered.log.log_end_offset == end
        last = recovered.producers.batch_metadata(7)[-1]
        assert (last.last_sequence, last.last_offset) == (4, b + 2)
        entry = {p.producer_id: p for p in recovered.producers.producers()}[8]
        assert entry.producer_epoch == 1
        assert recovered.producers.first_undecided_offset() is None
        assert recovered.last_stable_offset == recovered.high_watermark == end

        fetched = recovered.log.read(0, 1 << 20).data
        assert [(h.base_offset, h.records_count) for _, h in iter_batches(fetched)] == [
            (a, 2),
            (b, 0),
            (m, 0),
            (c, 1),
            (d, 1),
        ]
        values = [r.value for batch in iter_decoded_batches(fetched) for r in batch.records]
        assert values == [b"a1", b"a2", b"c", b"d"]
        # a read from inside the removed range starts at the next batch still there
        assert next(iter_batches(recovered.log.read(t, 1).data))[1].base_offset == m
        # ListOffsets by time steps over the emptied batch to the next record
        assert recovered.log.offset_for_timestamp(ts + 5) == (c, ts + 40)
        recovered.close()
        reopened = _open(directory, clock)  # and once more from the clean-shutdown state
        assert reopened.log.read(0, 1 << 20).data == fetched
        reopened.close()
    finally:
        recovered.log._abandon()
