"""Replacing rolled segments by cleaned ones, crash-safely (Kafka's `.cleaned`/`.swap`/`.deleted`
protocol, LogCleaner.cleanSegments and UnifiedLog.replaceSegments, recovered as LogLoader does).

A cleaned group of segments [X .. Y) becomes one segment X:

0. the cleaner writes `X.log.cleaned` and its `.index.cleaned`, `.timeindex.cleaned`,
   `.txnindex.cleaned` (`CleanedSegmentWriter`, on a worker thread), and fsyncs them;
1. renames them to `.swap`, the `.log` last: `X.log.swap` is the commit point;
2. renames every file of the replaced segments to `.deleted` (`X.log.deleted` is renamed);
3. renames the `.swap` files to their final names, the `.log` first;
4. unlinks the `.deleted` files.

The directory is fsynced after each step. Recovery (`resolve_swaps`, before the segments are
loaded) rolls back or completes: `.cleaned` and `.deleted` files are removed; with `X.log.swap`
present, the live files of every segment in [X, end of the swap) are removed and the swap
completed; `.swap` files without `X.log.swap` are completed when `X.log.deleted` exists (step 3
was under way) and removed otherwise (step 1 was). So a crash anywhere leaves either the old
segments or the new one, never both and never neither.

Every cleaned segment ends exactly where the segment after the group starts (the cleaner keeps
the group's last batch, emptied if need be), so the end of a swap names the replaced range and
segments stay contiguous from one to the next, as recovery checks.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from onceflow.log.config import LogConfig
from onceflow.log.errors import CorruptSegmentError
from onceflow.log.file_batches import iter_file_batches
from onceflow.log.file_handles import file_handles
from onceflow.log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SEGMENT_FILE_SUFFIXES,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    Segment,
    delete_segment_files,
    parse_segment_file_name,
    segment_file,
)
from onceflow.records.batch import iter_batches

logger = logging.getLogger(__name__)

CLEANED = ".cleaned"
SWAP = ".swap"
DELETED = ".deleted"

_TAILED_NAME = re.compile(r"^(\d{20})(\.[a-z]+)(\.cleaned|\.swap|\.deleted)$")
_LOG_LAST = (TXN_INDEX_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, LOG_SUFFIX)
_LOG_FIRST = (LOG_SUFFIX, TXN_INDEX_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)
_WRITE_CHUNK_BYTES = 1 << 20

Crash = Callable[[str], None]


def no_crash(point: str) -> None:
    return None


def _rename_tail(
    directory: Path, base: int, old_tail: str, new_tail: str, order: Iterable[str]
) -> None:
    for suffix in order:
        try:
            os.rename(
                segment_file(directory, base, suffix + old_tail),
                segment_file(directory, base, suffix + new_tail),
            )
        except FileNotFoundError:
            continue  # a segment without a .txnindex, or a step already done


def swap_in(
    directory: Path,
    base: int,
    replaced: list[int],
    sync_dir: Callable[[], None],
    crash: Crash = no_crash,
) -> None:
    """Steps 1 to 4 for the written and synced `base` `.cleaned` files replacing the segments
    at `replaced` (whose descriptors the caller closes)."""
    _rename_tail(directory, base, CLEANED, SWAP, _LOG_LAST)
    sync_dir()
    crash("cleaner.after-swap-rename")
    for old in replaced:
        _rename_tail(directory, old, "", DELETED, _LOG_FIRST)
    sync_dir()
    crash("cleaner.after-deleted-rename")
    _rename_tail(directory, base, SWAP, "", _LOG_FIRST)
    sync_dir()
    crash("cleaner.after-swap-complete")
    for old in replaced:
        delete_segment_files(directory, old, DELETED)


def resolve_swaps(directory: Path) -> bool:
    """Finish or roll back a swap a crash interrupted (see the module docstring); True when
    files were renamed or removed."""
    swaps: dict[int, set[str]] = {}
    leftovers: list[Path] = []
    live: list[tuple[int, Path]] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            tailed = _TAILED_NAME.match(entry.name)
            if tailed is not None and tailed.group(2) in SEGMENT_FILE_SUFFIXES:
                if tailed.group(3) == SWAP:
                    swaps.setdefault(int(tailed.group(1)), set()).add(tailed.group(2))
                else:
                    leftovers.append(Path(entry.path))
                continue
            parsed = parse_segment_file_name(entry.name)
            if parsed is not None:
                live.append((parsed[0], Path(entry.path)))
    for base, suffixes in sorted(swaps.items()):
        if LOG_SUFFIX in suffixes:
            end = _swap_end(directory, base)
            logger.warning(
                "completing the swap of cleaned segment %d (offsets up to %d) into %s",
                base,
                end,
                directory,
            )
            for offset, path in live:
                if base <= offset < end:
                    path.unlink(missing_ok=True)
            _rename_tail(directory, base, SWAP, "", _LOG_FIRST)
        elif segment_file(directory, base, LOG_SUFFIX + DELETED).exists():
            logger.warning("completing the renames of cleaned segment %d in %s", base, directory)
            _rename_tail(directory, base, SWAP, "", _LOG_FIRST)
        else:
            logger.warning("rolling back the unfinished swap of segment %d in %s", base, directory)
            delete_segment_files(directory, base, SWAP)
    for path in leftovers:
        path.unlink(missing_ok=True)
    changed = bool(swaps or leftovers)
    if changed:
        with file_handles().transient(directory, os.O_RDONLY | os.O_DIRECTORY) as fd:
            os.fsync(fd)
    return changed


def _swap_end(directory: Path, base: int) -> int:
    """The offset after the last batch of `base`'s `.log.swap` (synced before it was named)."""
    path = segment_file(directory, base, LOG_SUFFIX + SWAP)
    end = base
    with file_handles().transient(path, os.O_RDONLY) as fd:
        size = os.fstat(fd).st_size
        try:
            for _, header, _ in iter_file_batches(
                lambda length, position: os.pread(fd, length, position), 0, size
            ):
                end = header.next_offset
        except CorruptSegmentError as exc:
            # cannot happen to a synced file; the segment's own recovery cuts the tail
            logger.error("swap file %s is damaged (%s): keeping offsets below %d", path, exc, end)
    return end


class CleanedSegmentWriter:
    """Writes one cleaned segment's `.cleaned` files (step 0), from any thread: batches in
    offset order, each whole; `finish` syncs them. Memory: one write chunk."""

    def __init__(self, directory: Path, base_offset: int, config: LogConfig, now: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self._config = config
        self._segment = Segment.create(directory, base_offset, config, now, tail=CLEANED)
        self._buf = bytearray()
        self.next_offset = base_offset
        self.size = 0

    def write(self, batch: bytes | bytearray | memoryview) -> None:
        self._buf += batch
        if len(self._buf) >= _WRITE_CHUNK_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._buf:
            return
        headers = list(iter_batches(self._buf, verify_crc=False))
        self._segment.append(self._buf, headers, self._config)
        self.next_offset = headers[-1][1].next_offset
        self.size = self._segment.size
        self._buf = bytearray()

    def finish(self, txn_index: bytes) -> None:
        """Write what is buffered, the time index's last entry and `txn_index` (the
        `.txnindex` content, b"" for none), then fsync every file and close them."""
        self._flush()
        segment = self._segment
        segment.on_become_inactive()
        files = [segment.log_file, *segment.index_files()]
        if txn_index:
            path = segment_file(self.directory, self.base_offset, TXN_INDEX_SUFFIX + CLEANED)
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            with file_handles().transient(path, flags) as fd:
                view = memoryview(txn_index)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
        for file in files:
            file.fsync()
        segment.close()

    def abandon(self) -> None:
        """Remove the `.cleaned` files (a clean dropped half-way)."""
        self._segment.delete_files()
