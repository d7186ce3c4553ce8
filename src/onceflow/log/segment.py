"""One log segment: `{base_offset:020d}.log` plus its sparse `.index` and `.timeindex`.

The `.log` file holds RecordBatch bytes back to back, exactly as appended. A segment knows
its completed size (reads never go past it, so a half-written batch is never served), its
next offset, its max timestamp, and how to rebuild its indexes from the log file. Other
per-segment files (Kafka's `.txnindex`) follow the same naming and are deleted with it.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

from onceflow.log.config import LogConfig
from onceflow.log.errors import CorruptSegmentError, LogStorageError
from onceflow.log.file_batches import iter_file_batches
from onceflow.log.file_handles import FileHandle, file_handles
from onceflow.log.full_disk import check_space
from onceflow.log.offset_index import OffsetIndex
from onceflow.log.time_index import TimeIndex
from onceflow.records.batch import HEADER_SIZE, NO_TIMESTAMP, BatchHeader, parse_header

logger = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
SEGMENT_FILE_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)

_SEGMENT_NAME = re.compile(r"^(\d{20})(\.[a-z]+)$")
_INT32_MAX = (1 << 31) - 1
_LOOKUP_CHUNK_BYTES = 16 * 1024  # an index entry is ~index.interval.bytes before its target


def segment_file(directory: Path, base_offset: int, suffix: str) -> Path:
    return directory / f"{base_offset:020d}{suffix}"


def parse_segment_file_name(name: str) -> tuple[int, str] | None:
    """(base offset, suffix) of a segment file name, or None for any other file."""
    match = _SEGMENT_NAME.match(name)
    if match is None or match.group(2) not in SEGMENT_FILE_SUFFIXES:
        return None
    return int(match.group(1)), match.group(2)


def delete_segment_files(directory: Path, base_offset: int, tail: str = "") -> None:
    """Unlink every file of a segment, the log first (open() sweeps orphaned indexes);
    `tail` names the files of a segment being swapped in (`.cleaned`, `.swap`)."""
    for suffix in SEGMENT_FILE_SUFFIXES:
        segment_file(directory, base_offset, suffix + tail).unlink(missing_ok=True)


class Segment:
    """A segment's files and in-memory bookkeeping; owned by one thread (the log's).

    Its files are handles in the broker's descriptor cache: a segment nobody reads or
    writes holds no descriptor once the cache needs the room.
    """

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        file: FileHandle,
        config: LogConfig,
        created_ms: int,
        tail: str = "",
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.tail = tail  # "" for a live segment; ".cleaned" while the cleaner writes one
        self._file = file
        self.created_ms = created_ms
        self.size = 0  # bytes of complete batches; reads stop here
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = -1
        self.first_batch_timestamp: int | None = None  # what time-based rolling measures from
        self.bytes_since_last_index_entry = 0
        self.offset_index = OffsetIndex(
            segment_file(directory, base_offset, INDEX_SUFFIX + tail),
            base_offset,
            config.segment_index_bytes,
        )
        self.time_index = TimeIndex(
            segment_file(directory, base_offset, TIME_INDEX_SUFFIX + tail),
            base_offset,
            config.segment_index_bytes,
        )

    # -- creation and loading -----------------------------------------------------------

    @classmethod
    def create(
        cls, directory: Path, base_offset: int, config: LogConfig, now: int, tail: str = ""
    ) -> Segment:
        path = segment_file(directory, base_offset, LOG_SUFFIX + tail)
        file = file_handles().open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        segment = cls(directory, base_offset, file, config, now, tail)
        try:
            # The index files are made by their first write or sync (a new partition costs
            # one file, not three); a leftover of an earlier segment at this offset is emptied.
            for index in (segment.offset_index, segment.time_index):
                if os.path.lexists(index.path):
                    index.replace([])
        except BaseException:
            # A failed roll leaves nothing behind: the log appends nothing and stays as it was.
            segment.delete_files()
            raise
        return segment

    @classmethod
    def open_existing(
        cls, directory: Path, base_offset: int, config: LogConfig, now: int
    ) -> Segment:
        """Open the files; the caller then calls load() or recover()."""
        path = segment_file(directory, base_offset, LOG_SUFFIX)
        # Not opened here: loading thousands of segments must not hold thousands of files.
        file = file_handles().handle(path, os.O_RDWR)
        segment = cls(directory, base_offset, file, config, now)
        segment.size = path.stat().st_size
        return segment

    @property
    def log_path(self) -> Path:
        return segment_file(self.directory, self.base_offset, LOG_SUFFIX + self.tail)

    def load(self, config: LogConfig, next_base: int | None = None) -> bool:
        """Trust the log file and load the indexes; False when they need a rebuild (recover).

        `next_base` is the next segment's base offset (None for the last segment): only a
        segment followed by another may hold the gaps the cleaner leaves (it never cleans the
        active segment), and only below that base.

        The indexes are sanity-checked against the log (their last entries must name real
        batches); the segment's end is found by scanning the headers after the last offset
        index entry, so the caller can check that it meets the next segment.
        """
        if self.size > _INT32_MAX:
            return False
        offset_index = OffsetIndex.load(
            self.offset_index.path, self.base_offset, config.segment_index_bytes, self.size
        )
        time_index = TimeIndex.load(
            self.time_index.path, self.base_offset, config.segment_index_bytes
        )
        if offset_index is None or time_index is None:
            logger.warning("rebuilding unreadable indexes of segment %s", self.log_path)
            return False
        self.offset_index, self.time_index = offset_index, time_index
        last_entry = offset_index.last_entry
        scan_from = 0 if last_entry is None else last_entry[1]
        try:
            if last_entry is not None:
                header = self._header_at(last_entry[1])
                if header is None or header.last_offset != last_entry[0]:
                    logger.warning("offset index of %s does not match its log", self.log_path)
                    return False
            if self.size > 0:
                first = self._header_at(0)
                if first is None or not _follows(first, self.base_offset, next_base):
                    logger.warning("segment %s does not start at its base offset", self.log_path)
                    return False
                self.first_batch_timestamp = first.max_timestamp
            if time_index.last_entry is not None:
                self.max_timestamp, self.offset_of_max_timestamp = time_index.last_entry
                # The entry names the batch that reached that max timestamp: check it does.
                located = self.translate_offset(self.offset_of_max_timestamp)
                if located is None or located[1].max_timestamp != self.max_timestamp:
                    logger.warning("time index of %s does not match its log", self.log_path)
                    return False
            # Find the end and finish the bookkeeping from the tail.
            self.bytes_since_last_index_entry = self.size - scan_from
            expected = self.base_offset if scan_from == 0 else None
            for _, header, _ in iter_file_batches(self._file.pread, scan_from, self.size):
                if expected is not None and not _follows(header, expected, next_base):
                    return False
                self._observe_max_timestamp(header)
                expected = header.next_offset
            self.next_offset = self.base_offset if expected is None else expected
            if self.offset_of_max_timestamp >= self.next_offset:
                return False
        except CorruptSegmentError as exc:
            logger.warning("segment %s has a bad tail (%s); recovering it", self.log_path, exc)
            return False
        return True

    def recover(self, config: LogConfig, next_base: int | None = None) -> int:
        """CRC-check every batch, truncate after the last valid one, rebuild the indexes.

        Offsets must be contiguous, except in a segment followed by another (`next_base`),
        which may hold the cleaner's gaps (base offsets then only grow, below `next_base`).

        Returns the number of bytes truncated (a torn or corrupt tail).
        """
        file_size = self._file.size()
        self.size = 0
        self.next_offset = self.base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = -1
        self.first_batch_timestamp = None
        self.bytes_since_last_index_entry = 0
        self.offset_index.replace([])
        self.time_index.replace([])
        valid_end = 0
        try:
            for position, header, _ in iter_file_batches(
                self._file.pread,
                0,
                min(file_size, _INT32_MAX),
                verify_crc=True,
                chunk_bytes=1 << 20,
            ):
                if not _follows(header, self.next_offset, next_base):
                    raise CorruptSegmentError(
                        f"batch base offset {header.base_offset}, expected {self.next_offset}",
                        position,
                    )
                if header.last_offset_delta < 0 or header.last_offset - self.base_offset > (
                    _INT32_MAX
                ):
                    raise CorruptSegmentError(
                        f"last offset delta {header.last_offset_delta} is out of range", position
                    )
                self._track_batch(position, header, config)
                valid_end = position + header.size
        except CorruptSegmentError as exc:
            logger.warning("segment %s: %s; truncating the tail there", self.log_path, exc)
        truncated = file_size - valid_end
        if truncated:
            logger.warning(
                "segment %s: truncated %d bytes after offset %d",
                self.log_path,
                truncated,
                self.next_offset,
            )
            with self._file.pinned() as fd:
                os.ftruncate(fd, valid_end)
        self.size = valid_end
        self.time_index.maybe_append(
            self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True
        )
        return truncated

    # -- appends ------------------------------------------------------------------------

    def should_roll(
        self,
        config: LogConfig,
        *,
        messages_size: int,
        max_timestamp: int,
        last_offset: int,
        now: int,
    ) -> bool:
        """Kafka's roll rule: full by size or index, too old, or offsets past int32 range."""
        if self.size > config.segment_bytes - messages_size:
            return True
        if self.size > 0 and self._time_waited_for_roll(now, max_timestamp) > config.segment_ms:
            return True
        if self.offset_index.is_full or self.time_index.is_full:
            return True
        return last_offset - self.base_offset > _INT32_MAX

    def _time_waited_for_roll(self, now: int, max_timestamp: int) -> int:
        # Kafka measures segment age by record timestamps when it has them, else wall time.
        if self.first_batch_timestamp is not None and self.first_batch_timestamp >= 0:
            return max_timestamp - self.first_batch_timestamp
        return now - self.created_ms

    def append(
        self, data: bytes | bytearray, headers: list[tuple[int, BatchHeader]], config: LogConfig
    ) -> None:
        """Write batches (offsets already assigned) at the end; one pwrite unless it is short."""
        start = self.size
        view = memoryview(data)
        written = 0
        # The one descriptor this append needs (index entries wait in memory: IndexFile)
        # is pinned before the first byte is written: running out of descriptors then fails
        # the append with nothing written.
        with self._file.pinned() as fd:
            try:
                check_space()
                while written < len(view):
                    written += os.pwrite(fd, view[written:], start + written)
            except OSError as exc:
                self._undo_partial_write(fd, start)
                raise LogStorageError(f"write to {self.log_path} failed: {exc}") from exc
        if start == 0:
            self.first_batch_timestamp = headers[0][1].max_timestamp
        for position, header in headers:
            self._track_batch(start + position, header, config)
        self.size = start + len(view)
        self.next_offset = headers[-1][1].next_offset

    def _undo_partial_write(self, fd: int, start: int) -> None:
        try:
            os.ftruncate(fd, start)
        except OSError as exc:
            # Reads stop at self.size anyway; recovery will cut the torn bytes on next open.
            logger.error("could not cut a partial write from %s: %s", self.log_path, exc)

    def _track_batch(self, position: int, header: BatchHeader, config: LogConfig) -> None:
        """Kafka's per-batch bookkeeping: max timestamp, and an index entry every interval."""
        self._observe_max_timestamp(header)
        if self.bytes_since_last_index_entry > config.index_interval_bytes:
            if not self.offset_index.is_full:
                self.offset_index.append(header.last_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self.bytes_since_last_index_entry = 0
        self.bytes_since_last_index_entry += header.size
        if self.size <= position:
            # Recovery walks the file: keep size and end offset in step with it.
            self.size = position + header.size
            self.next_offset = header.next_offset
        if self.first_batch_timestamp is None:
            self.first_batch_timestamp = header.max_timestamp

    def _observe_max_timestamp(self, header: BatchHeader) -> None:
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.offset_of_max_timestamp = header.last_offset

    def on_become_inactive(self) -> None:
        """Called on roll and on clean close: make the time index's last entry the max, and
        write the index entries kept in memory."""
        self.time_index.maybe_append(
            self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True
        )
        self.offset_index.write_pending()
        self.time_index.write_pending()

    # -- reads --------------------------------------------------------------------------

    def _header_at(self, position: int) -> BatchHeader | None:
        if position + HEADER_SIZE > self.size:
            return None
        raw = self._file.pread(HEADER_SIZE, position)
        if len(raw) < HEADER_SIZE:
            return None
        return parse_header(raw)

    def translate_offset(self, offset: int) -> tuple[int, BatchHeader] | None:
        """(position, header) of the batch containing `offset`, or None if past the end."""
        start = self.offset_index.lookup(offset)
        for position, header, _ in iter_file_batches(
            self._file.pread, start, self.size, chunk_bytes=_LOOKUP_CHUNK_BYTES
        ):
            if header.last_offset >= offset:
                return position, header
        return None

    def read_batches(
        self, position: int, max_bytes: int, max_offset: int, min_size: int = 0
    ) -> tuple[bytes, int | None, bool]:
        """Whole batches from `position`: at most max(max_bytes, min_size) bytes, each with
        base offset < max_offset. Returns (data, next offset after it or None, reached end).
        """
        end = self.size
        want = min(end - position, max(max_bytes, min_size))
        if want < HEADER_SIZE:
            return b"", None, position >= end
        buf = self._file.pread(want, position)
        off = 0
        next_offset: int | None = None
        while off + HEADER_SIZE <= len(buf):
            header = parse_header(buf, off)
            if header.base_offset >= max_offset or off + header.size > len(buf):
                break
            off += header.size
            next_offset = header.next_offset
        data = buf if off == len(buf) else buf[:off]
        return data, next_offset, position + off >= end

    def find_offset_by_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(base offset, max timestamp) of the first batch whose max timestamp >= timestamp."""
        if self.max_timestamp < timestamp:
            return None
        start = self.offset_index.lookup(self.time_index.lookup(timestamp))
        for _, header, _ in iter_file_batches(self._file.pread, start, self.size):
            # An emptied batch (kept by the cleaner) holds no record to point a consumer at.
            if header.max_timestamp >= timestamp and header.records_count > 0:
                return header.base_offset, header.max_timestamp
        return None

    def iter_batches(
        self, from_offset: int, *, with_bytes: bool
    ) -> Iterator[tuple[BatchHeader, bytes | None]]:
        """Batches from the one containing `from_offset` to the end of the segment."""
        start = self.offset_index.lookup(from_offset)
        for _, header, data in iter_file_batches(
            self._file.pread, start, self.size, with_bytes=with_bytes
        ):
            if header.last_offset >= from_offset:
                yield header, data

    def largest_timestamp(self) -> int:
        """For time retention: the max record timestamp, else the file's modification time."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        with self._file.pinned() as fd:
            return os.fstat(fd).st_mtime_ns // 1_000_000

    # -- files --------------------------------------------------------------------------

    @property
    def log_file(self) -> FileHandle:
        return self._file

    def index_files(self) -> list[FileHandle]:
        """The index files' handles, with every entry written: what a sync makes durable."""
        self.offset_index.write_pending()
        self.time_index.write_pending()
        return [self.offset_index.file, self.time_index.file]

    def close_index_files(self) -> None:
        """Once a rolled segment's indexes are on disk, keep only the log descriptor open."""
        self.offset_index.close()
        self.time_index.close()

    def close(self) -> None:
        self.close_index_files()
        self._file.close()

    def delete_files(self) -> None:
        """Close and unlink every file of this segment."""
        self.close()
        delete_segment_files(self.directory, self.base_offset, self.tail)


def _follows(header: BatchHeader, expected: int, next_base: int | None) -> bool:
    """Whether a batch may come where offset `expected` is due: exactly there, or, in a
    segment the cleaner may have rewritten (one followed by `next_base`), anywhere from there
    as long as it ends below the next segment."""
    if next_base is None:
        return header.base_offset == expected
    return expected <= header.base_offset and header.last_offset < next_base
