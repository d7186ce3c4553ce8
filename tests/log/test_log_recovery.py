from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from log_batches import batches, make_batch, stored

from onceflow.clock import ManualClock
from onceflow.log.config import LogConfig
from onceflow.log.partition_log import PartitionLog
from onceflow.log.recovery import CLEAN_SHUTDOWN_FILE
from onceflow.log.recovery_point import RECOVERY_POINT_FILE, RecoveryPointFile
from onceflow.log.segment import Segment

CONFIG = LogConfig(segment_bytes=700, index_interval_bytes=120)


def fill(log, counts, value=b"x" * 15):
    out = []
    for n in counts:
        raw = make_batch(n, value=value)
        info = log.append(*batches(raw))
        out.append((info.first_offset, info.last_offset, stored(raw, info.first_offset)))
    return out


def log_file(log_dir: Path, base: int, suffix: str = ".log") -> Path:
    return log_dir / f"{base:020d}{suffix}"


@pytest.fixture
def recovered_bases(monkeypatch):
    """Base offsets of the segments that open() CRC-scans."""
    seen: list[int] = []
    original = Segment.recover

    def spy(self, config, next_base=None):
        seen.append(self.base_offset)
        return original(self, config, next_base)

    monkeypatch.setattr(Segment, "recover", spy)
    return seen


def test_reopen_after_clean_close_skips_the_scan(open_log, recovered_bases):
    log = open_log(CONFIG)
    expected = fill(log, [1, 3, 2, 5, 1] * 6)
    bases = log.segment_base_offsets
    log.close()
    assert (log.directory / CLEAN_SHUTDOWN_FILE).exists()

    log = open_log(CONFIG)
    assert recovered_bases == []
    assert not (log.directory / CLEAN_SHUTDOWN_FILE).exists()  # a crash from now is unclean
    assert log.segment_base_offsets == bases
    assert log.log_end_offset == expected[-1][1] + 1
    assert log.read(0, 1 << 20).data == b"".join(r for _, _, r in expected)
    more = fill(log, [2])
    assert more[0][0] == expected[-1][1] + 1


def test_unclean_reopen_scans_only_from_the_recovery_point(open_log, recovered_bases):
    log = open_log(CONFIG)
    expected = fill(log, [2] * 40)
    ticket = log.prepare_flush()
    ticket.run()
    log.complete_flush(ticket)
    durable_bases = log.segment_base_offsets
    assert RecoveryPointFile.read(log.directory) == durable_bases[-1]
    fill(log, [2] * 20)  # rolls again, never flushed
    all_bases = log.segment_base_offsets
    assert len(all_bases) > len(durable_bases)
    log._abandon()  # kill -9: no flush, no marker

    log = open_log(CONFIG)
    assert recovered_bases == all_bases[len(durable_bases) - 1 :]
    assert log.log_end_offset == 120
    assert log.read(0, 1 << 20).data.startswith(b"".join(r for _, _, r in expected))


def test_truncated_tail_at_every_byte_of_the_last_batch(tmp_path, clock):
    log = PartitionLog.open(tmp_path / "src", CONFIG, clock)
    expected = fill(log, [1, 2, 3, 4])
    log.close()
    last_first, _, last_raw = expected[-1]
    segment = log_file(tmp_path / "src", 0)
    full = segment.stat().st_size
    kept = b"".join(r for _, _, r in expected[:-1])
    for cut in range(full - len(last_raw), full + 1):
        work = tmp_path / f"cut-{cut}"
        shutil.copytree(tmp_path / "src", work)
        (work / CLEAN_SHUTDOWN_FILE).unlink()
        os.truncate(log_file(work, 0), cut)
        recovered = PartitionLog.open(work, CONFIG, clock)
        try:
            whole = cut == full
            assert recovered.log_end_offset == (expected[-1][1] + 1 if whole else last_first)
            assert recovered.read(0, 1 << 20).data == (kept + last_raw if whole else kept)
            assert log_file(work, 0).stat().st_size == (full if whole else len(kept))
            # The log goes on from the cut, contiguously.
            info = recovered.append(*batches(make_batch(1)))
            assert info.first_offset == recovered.log_end_offset - 1
        finally:
            recovered._abandon()
        shutil.rmtree(work)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    counts=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    cut_back=st.integers(1, 400),
)
def test_torn_tail_property(tmp_path_factory, counts, cut_back):
    directory = tmp_path_factory.mktemp("torn") / "p"
    clock = ManualClock()
    log = PartitionLog.open(directory, CONFIG, clock)
    expected = fill(log, counts)
    active = log.segment_base_offsets[-1]
    log._abandon()
    path = log_file(directory, active)
    size = path.stat().st_size
    cut = max(0, size - cut_back)
    os.truncate(path, cut)

    log = PartitionLog.open(directory, CONFIG, clock)
    try:
        # Exactly the batches wholly below the cut survive, and nothing else.
        survivors = [e for e in expected if e[0] < active]
        position = 0
        for e in expected:
            if e[0] >= active:
                position += len(e[2])
                if position <= cut:
                    survivors.append(e)
        assert log.log_end_offset == (survivors[-1][1] + 1 if survivors else 0)
        assert log.read(0, 1 << 20).data == b"".join(r for _, _, r in survivors)
    finally:
        log._abandon()


@pytest.mark.parametrize("flip_at", [0, 5, 9, 11, 16, 17, 20, 21, 30, 40, 60, 61, -1])
def test_bit_flipped_tail_is_cut(open_log, flip_at):
    log = open_log(CONFIG)
    expected = fill(log, [1, 2, 3])
    log._abandon()
    path = log_file(log.directory, 0)
    raw = bytearray(path.read_bytes())
    last_pos = len(raw) - len(expected[-1][2])
    index = last_pos + (flip_at if flip_at >= 0 else len(expected[-1][2]) - 1)
    raw[index] ^= 0x04
    path.write_bytes(raw)

    log = open_log(CONFIG)
    assert log.log_end_offset == expected[-1][0]
    assert log.read(0, 1 << 20).data == b"".join(r for _, _, r in expected[:-1])
    assert path.stat().st_size == last_pos


def test_corrupt_batch_mid_segment_cuts_everything_after_it(open_log):
    log = open_log(LogConfig())
    expected = fill(log, [1] * 10)
    log._abandon()
    path = log_file(log.directory, 0)
    raw = bytearray(path.read_bytes())
    fourth = sum(len(r) for _, _, r in expected[:3])
    raw[fourth + 40] ^= 0xFF
    path.write_bytes(raw)
    log = open_log(LogConfig())
    assert log.log_end_offset == 3


def test_torn_unflushed_rolled_segment_drops_the_later_ones(open_log):
    log = open_log(CONFIG)
    fill(log, [2] * 30)
    bases = log.segment_base_offsets
    assert len(bases) >= 3
    log._abandon()  # nothing was flushed: every segment is suspect
    second = log_file(log.directory, bases[1])
    os.truncate(second, second.stat().st_size - 3)

    log = open_log(CONFIG)
    assert log.segment_base_offsets == bases[:2]
    assert log.log_end_offset < bases[2]
    assert not log_file(log.directory, bases[2]).exists()
    assert not log_file(log.directory, bases[2], ".index").exists()
    info = log.append(*batches(make_batch(1)))
    assert info.first_offset == log.log_end_offset - 1
    assert [h.base_offset for h in log.iter_batch_headers()][-1] == info.first_offset


@pytest.mark.parametrize("damage", ["missing", "garbage", "misaligned", "wrong-positions"])
@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
def test_bad_index_files_are_rebuilt(open_log, damage, suffix):
    log = open_log(CONFIG)
    expected = fill(log, [1, 2, 1, 3] * 10)
    bases = log.segment_base_offsets
    log.close()
    originals = {b: log_file(log.directory, b, suffix).read_bytes() for b in bases}
    target = log_file(log.directory, bases[1], suffix)
    original = target.read_bytes()
    assert original, "the test needs a non-empty index"
    if damage == "missing":
        target.unlink()
    elif damage == "garbage":
        target.write_bytes(os.urandom(len(original)))
    elif damage == "misaligned":
        target.write_bytes(original + b"\x01")
    else:
        # Well-formed entries that point at the wrong place (the offset index's positions,
        # or time index timestamps going backwards).
        shifted = bytearray(original)
        if suffix == ".index":
            shifted[-1] = (shifted[-1] + 1) % 256
        else:
            shifted[:8] = (2**62).to_bytes(8, "big")
        target.write_bytes(shifted)

    log = open_log(CONFIG)
    assert log.read(0, 1 << 20).data == b"".join(r for _, _, r in expected)
    for b in bases:
        assert log_file(log.directory, b, suffix).read_bytes() == originals[b]
    for _, last, raw in expected:
        assert log.read(last, 1).data == raw


def test_index_entries_kept_in_memory_reach_the_files_on_roll_and_close(open_log):
    # Appends keep index entries in memory; rolls and the clean close write them. The files
    # must then hold exactly what a rebuild from the log gives, for every segment.
    log = open_log(CONFIG)
    fill(log, [1, 2, 1, 3] * 10)
    bases = log.segment_base_offsets
    log.close()
    suffixes = (".index", ".timeindex")
    written = {(b, s): log_file(log.directory, b, s).read_bytes() for b in bases for s in suffixes}
    assert all(written[(b, ".index")] for b in bases), "the test needs entries in each segment"
    for b in bases:
        for suffix in suffixes:
            log_file(log.directory, b, suffix).unlink()
    open_log(CONFIG).close()  # rebuilds the missing indexes from the log
    for (b, suffix), data in written.items():
        assert log_file(log.directory, b, suffix).read_bytes() == data, (b, suffix)


def test_orphaned_index_files_and_temp_files_are_swept(open_log):
    log = open_log(CONFIG)
    fill(log, [1])
    log.close()
    orphan = log_file(log.directory, 500, ".index")
    orphan.write_bytes(b"")
    tmp = log.directory / (RECOVERY_POINT_FILE + ".tmp")
    tmp.write_bytes(b"half")
    log = open_log(CONFIG)
    assert not orphan.exists() and not tmp.exists()
    assert log.segment_base_offsets == [0]


def test_crash_without_flush_keeps_what_the_os_has(open_log):
    # A process crash (not a power loss) leaves written data in the page cache.
    log = open_log(CONFIG)
    expected = fill(log, [3, 1, 4, 1, 5, 9, 2, 6] * 3)
    log._abandon()
    log = open_log(CONFIG)
    assert log.read(0, 1 << 20).data == b"".join(r for _, _, r in expected)
    assert log.flushed_offset == log.log_end_offset  # open made the recovered tail durable


def test_garbage_recovery_point_means_scanning_everything(open_log, recovered_bases):
    log = open_log(CONFIG)
    fill(log, [2] * 30)
    bases = log.segment_base_offsets
    log.close()
    (log.directory / CLEAN_SHUTDOWN_FILE).unlink()
    (log.directory / RECOVERY_POINT_FILE).write_text("not a number")
    log = open_log(CONFIG)
    assert recovered_bases == bases
    assert RecoveryPointFile.read(log.directory) == bases[-1]


def test_a_missing_middle_segment_ends_the_log_there(open_log):
    log = open_log(CONFIG)
    fill(log, [2] * 30)
    bases = log.segment_base_offsets
    log.close()
    log_file(log.directory, bases[1]).unlink()
    log = open_log(CONFIG)
    # Offsets must stay contiguous: nothing after the hole survives.
    assert log.segment_base_offsets == [0]
    assert log.log_end_offset == bases[1]
    assert not log_file(log.directory, bases[2]).exists()
    assert not log_file(log.directory, bases[1], ".index").exists()
