"""The aborted-transaction index of one partition: Kafka's `.txnindex` files, one per segment.

An entry per aborted, non-empty transaction: (version int16 = 0, producer id int64, first
offset int64, last offset int64, last stable offset int64), 34 bytes, big-endian, appended to
the file of the segment holding the ABORT marker, `{segment_base_offset:020d}.txnindex` next
to the segment's `.log`. Entries are ordered by last offset across the whole partition; all
of them are kept in memory too, so read_committed fetches never touch the disk.

Durability: `add` writes without fsync; `flush` fsyncs (from a worker thread if wanted) and is
due before the marker's write is acknowledged. Recovery: `truncate_after(offset)` then `add`
for every aborted transaction the replay of the log from `offset` on reports.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from onceflow.log.errors import DescriptorsExhaustedError
from onceflow.log.file_handles import FileHandle, file_handles
from onceflow.log.full_disk import check_space
from onceflow.log.producer_errors import CorruptTxnIndexError, TxnIndexStorageError
from onceflow.log.producer_state import CompletedTxn

logger = logging.getLogger(__name__)

TXN_INDEX_SUFFIX = ".txnindex"
CURRENT_VERSION = 0
ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = ENTRY.size  # 34, as Kafka's AbortedTxn.TOTAL_SIZE

_TXN_INDEX_NAME = re.compile(r"^(\d{20})\.txnindex$")
_LOG_NAME = re.compile(r"^(\d{20})\.log$")


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset
    last_stable_offset: int  # the partition's LSO right after the abort


def aborted_entry(completed: CompletedTxn) -> AbortedTxn | None:
    """The index entry of a completed transaction: None for a commit, which needs none."""
    if not completed.is_aborted:
        return None
    return AbortedTxn(
        completed.producer_id,
        completed.first_offset,
        completed.last_offset,
        completed.last_stable_offset,
    )


def txn_index_file(directory: Path, base_offset: int) -> Path:
    return directory / f"{base_offset:020d}{TXN_INDEX_SUFFIX}"


class _IndexFile:
    """One segment's `.txnindex`: its entries (the first `written` of them in the file) and,
    once written to, a handle in the broker's descriptor cache."""

    __slots__ = ("base_offset", "entries", "file", "path", "written")

    def __init__(self, path: Path, base_offset: int, entries: list[AbortedTxn]) -> None:
        self.path = path
        self.base_offset = base_offset
        self.entries = entries
        self.written = len(entries)
        self.file: FileHandle | None = None

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class AbortedTxnIndex:
    """Every `.txnindex` of one partition directory, as one ordered list of AbortedTxn.

    Owned by one thread (the partition's); only `flush` may run on another thread.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._files: dict[int, _IndexFile] = {}
        self._entries: list[AbortedTxn] = []
        self._last_offsets: list[int] = []
        self._lock = threading.Lock()  # guards fds and the dirty set against flush()
        self._dirty: set[int] = set()
        self._dir_dirty = False
        for path in sorted(self.directory.iterdir()):
            match = _TXN_INDEX_NAME.match(path.name)
            if match is not None:
                base = int(match.group(1))
                self._files[base] = _IndexFile(path, base, _load(path, base))
        self._rebuild_view()
        if any(a >= b for a, b in zip(self._last_offsets, self._last_offsets[1:], strict=False)):
            raise CorruptTxnIndexError(f"{self.directory}: index files overlap")

    @classmethod
    def open(cls, directory: Path) -> AbortedTxnIndex:
        """Load the index files of a partition directory (created if missing)."""
        return cls(directory)

    @staticmethod
    def delete_files(directory: Path) -> None:
        """Remove every `.txnindex` of a partition, e.g. to rebuild a corrupt index."""
        for path in Path(directory).iterdir():
            if _TXN_INDEX_NAME.match(path.name):
                path.unlink(missing_ok=True)

    # -- reads ---------------------------------------------------------------------------------

    def collect(self, fetch_offset: int, upper_bound: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of every aborted transaction overlapping
        [fetch_offset, upper_bound): last offset >= fetch_offset, first offset < upper_bound."""
        result = []
        for txn in self._entries[bisect.bisect_left(self._last_offsets, fetch_offset) :]:
            if txn.first_offset < upper_bound:
                result.append((txn.producer_id, txn.first_offset))
            # transactions aborted later all start at or after this one's LSO
            if txn.last_stable_offset >= upper_bound:
                break
        return result

    def entries(self) -> list[AbortedTxn]:
        """Every entry, ordered by last offset."""
        return list(self._entries)

    @property
    def segment_base_offsets(self) -> list[int]:
        """Base offsets of the segments that have an index file."""
        return sorted(self._files)

    def __len__(self) -> int:
        return len(self._entries)

    # -- writes --------------------------------------------------------------------------------

    def add(
        self, completed: CompletedTxn, segment_base_offset: int | None = None
    ) -> AbortedTxn | None:
        """Index a completed transaction if it was aborted; commits need no entry (None).

        `segment_base_offset` is the segment holding the marker; by default the segment of
        the directory's `.log` files that contains the marker's offset.
        """
        txn = aborted_entry(completed)
        if txn is None:
            return None
        return self.append(txn, segment_base_offset)

    def append(self, txn: AbortedTxn, segment_base_offset: int | None = None) -> AbortedTxn:
        """Append an entry. Last offsets must increase; re-adding the latest entries (same
        producer, first and last offset) during a recovery replay returns the stored one."""
        if txn.first_offset > txn.last_offset:
            raise ValueError(f"aborted transaction {txn} starts after its marker")
        if self._last_offsets and txn.last_offset <= self._last_offsets[-1]:
            existing = self._find(txn.last_offset)
            if existing is not None and (existing.producer_id, existing.first_offset) == (
                txn.producer_id,
                txn.first_offset,
            ):
                return existing
            raise ValueError(
                f"aborted transaction {txn} does not come after the last indexed marker "
                f"at offset {self._last_offsets[-1]}"
            )
        base = (
            self._segment_for(txn.last_offset)
            if segment_base_offset is None
            else segment_base_offset
        )
        if base > txn.last_offset:
            raise ValueError(f"marker offset {txn.last_offset} is below segment base {base}")
        with self._lock:
            file = self._files.get(base)
            if file is None:
                path = txn_index_file(self.directory, base)
                file = self._files[base] = _IndexFile(path, base, [])
            handle = self._writable(file)
            file.entries.append(txn)
            self._dirty.add(base)
            try:
                self._write_pending(file, handle)
            except DescriptorsExhaustedError as exc:
                # The marker is in the log already: keep the entry, write it at the next
                # flush, which is due before the marker is acknowledged (and before any
                # producer snapshot), so nothing unwritten is ever taken as durable.
                logger.warning("%s: entry kept in memory until the next flush: %s", file.path, exc)
        self._entries.append(txn)
        self._last_offsets.append(txn.last_offset)
        return txn

    def _find(self, last_offset: int) -> AbortedTxn | None:
        i = bisect.bisect_left(self._last_offsets, last_offset)
        if i < len(self._last_offsets) and self._last_offsets[i] == last_offset:
            return self._entries[i]
        return None

    def _segment_for(self, offset: int) -> int:
        candidates = [b for b in self._known_bases() if b <= offset]
        return max(candidates) if candidates else 0

    def _known_bases(self) -> set[int]:
        # the log's segments decide where an entry belongs; our own files cover a bare index
        bases = set(self._files)
        for name in os.listdir(self.directory):
            match = _LOG_NAME.match(name)
            if match is not None:
                bases.add(int(match.group(1)))
        return bases

    def _write_pending(self, file: _IndexFile, handle: FileHandle) -> None:
        """Write the entries not yet in the file; called with the lock held."""
        pending = file.entries[file.written :]
        if not pending:
            return
        data = b"".join(
            ENTRY.pack(
                CURRENT_VERSION, t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset
            )
            for t in pending
        )
        with handle.pinned() as fd:
            try:
                check_space()
                os.pwrite(fd, data, file.written * ENTRY_SIZE)
            except OSError as exc:
                raise TxnIndexStorageError(f"cannot write {file.path}: {exc}") from exc
        file.written = len(file.entries)

    def _writable(self, file: _IndexFile) -> FileHandle:
        """The file's handle, created if needed; called with the lock held."""
        gone = file.written > 0 and not file.path.exists()
        if gone:
            # the log deleted the segment's files behind our back: those entries went with it
            logger.warning(
                "%s was deleted externally; forgetting its %d entries",
                file.path,
                len(file.entries),
            )
            file.close()
            file.entries.clear()
            file.written = 0
            self._rebuild_view()
        if file.file is None:
            created = not file.path.exists()
            file.file = file_handles().handle(file.path, os.O_RDWR | os.O_CREAT)
            self._dir_dirty = self._dir_dirty or created
        return file.file

    def flush(self) -> None:
        """Write what add() could not, then fsync what was written since the last flush; safe
        to run on a worker thread. DescriptorsExhaustedError leaves everything dirty."""
        with self._lock:
            bases = sorted(b for b in self._dirty if b in self._files)
            handles: list[FileHandle] = []
            for base in bases:
                file = self._files[base]
                handle = self._writable(file)
                self._write_pending(file, handle)
                handles.append(handle)
            sync_dir = self._dir_dirty
            self._dirty.clear()
            self._dir_dirty = False
        try:
            for handle in handles:
                handle.fsync()
            if sync_dir:
                with file_handles().transient(self.directory, os.O_RDONLY) as dir_fd:
                    os.fsync(dir_fd)
        except (OSError, DescriptorsExhaustedError) as exc:
            with self._lock:
                self._dirty.update(b for b in bases if b in self._files)
                self._dir_dirty = self._dir_dirty or sync_dir
            if isinstance(exc, DescriptorsExhaustedError):
                raise
            raise TxnIndexStorageError(
                f"cannot fsync the aborted-transaction index: {exc}"
            ) from exc

    def truncate_after(self, offset: int) -> None:
        """Drop the entries whose marker is at or after `offset` (the new log end offset), as
        Kafka's TransactionIndex.truncateTo; index files of segments above it are removed."""
        for base in sorted(self._files, reverse=True):
            file = self._files[base]
            keep = [t for t in file.entries if t.last_offset < offset]
            if base > offset and not keep:
                self._remove_file(base)
            elif len(keep) != len(file.entries):
                self._rewrite_length(file, keep)
        self._rebuild_view()

    def delete_before(self, offset: int) -> None:
        """Remove the index files of segments that end at or before `offset`, the new log
        start offset (retention deleted those segments)."""
        bases = sorted(self._known_bases())
        for base in sorted(self._files):
            later = bases[bisect.bisect_right(bases, base) :]
            if later and later[0] <= offset:
                self._remove_file(base)
        self._rebuild_view()

    def replace_segments(self, replaced: list[int], base: int) -> None:
        """The log swapped a cleaned segment `base` in for the segments at `replaced` (their
        `.txnindex` files went with them): forget theirs, load the cleaned one's, if any."""
        with self._lock:
            for old in replaced:
                file = self._files.pop(old, None)
                if file is not None:
                    file.close()
                self._dirty.discard(old)
            path = txn_index_file(self.directory, base)
            if path.exists():
                self._files[base] = _IndexFile(path, base, _load(path, base))
        self._rebuild_view()

    def close(self) -> None:
        """Flush and close every file."""
        self.flush()
        with self._lock:
            for file in self._files.values():
                file.close()

    def _rewrite_length(self, file: _IndexFile, keep: list[AbortedTxn]) -> None:
        with self._lock:
            file.written = min(file.written, len(keep))
            try:
                if file.path.exists():
                    os.truncate(file.path, file.written * ENTRY_SIZE)
            except OSError as exc:
                raise TxnIndexStorageError(f"cannot truncate {file.path}: {exc}") from exc
            self._dirty.add(file.base_offset)
            file.entries[:] = keep

    def _remove_file(self, base: int) -> None:
        with self._lock:
            file = self._files.pop(base)
            file.close()
            self._dirty.discard(base)
            self._dir_dirty = True
        file.path.unlink(missing_ok=True)

    def _rebuild_view(self) -> None:
        self._entries = [t for base in sorted(self._files) for t in self._files[base].entries]
        self._last_offsets = [t.last_offset for t in self._entries]


def _load(path: Path, base_offset: int) -> list[AbortedTxn]:
    """Read one index file; a torn last entry (a crash mid-append) is cut off."""
    raw = path.read_bytes()
    whole = len(raw) - len(raw) % ENTRY_SIZE
    if whole != len(raw):
        logger.warning("%s: dropping a torn entry of %d bytes", path, len(raw) - whole)
        os.truncate(path, whole)
    entries = []
    previous = -1
    for version, producer_id, first, last, lso in ENTRY.iter_unpack(raw[:whole]):
        if not 0 <= version <= CURRENT_VERSION:
            raise CorruptTxnIndexError(f"{path}: unknown aborted transaction version {version}")
        if last < base_offset or first > last or last <= previous:
            raise CorruptTxnIndexError(
                f"{path}: entry (producer {producer_id}, {first}..{last}) is out of place"
            )
        previous = last
        entries.append(AbortedTxn(producer_id, first, last, lso))
    return entries


def encode_entries(entries: list[AbortedTxn]) -> bytes:
    """The content of a `.txnindex` holding `entries` (a cleaned segment's)."""
    return b"".join(
        ENTRY.pack(
            CURRENT_VERSION, t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset
        )
        for t in entries
    )
