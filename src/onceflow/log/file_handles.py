"""A broker-wide, bounded cache of open file descriptors for the log layer (an LRU).

Segments, their indexes, aborted-transaction indexes and partition directories are named by
a `FileHandle`, not held open: a handle is opened on demand, pinned while in use (a read, an
append, an fsync) and closed when the cache needs room, least recently used first. So a
partition that is not being read or written holds no descriptor once others need them, and
a log of many small segments (a tiny `segment.bytes` or `segment.ms`) costs disk, not
descriptors. The hot path (the active segment of a busy partition) stays a cache hit.

EMFILE/ENFILE while opening first closes idle descriptors and retries; if that is not enough
the opener gets `DescriptorsExhaustedError`, which fails the one request (retriable
KAFKA_STORAGE_ERROR) and is not a storage failure: nothing was written.

An fsync of a file whose descriptor was evicted reopens it by path: on Linux an fsync
through any descriptor of the inode flushes it, and (since 4.16) a writeback error that no
descriptor has seen yet is reported to one opened later, so evicting loses no error.

Thread-safe: the owning thread appends and reads, flush workers fsync.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from onceflow.log.errors import DescriptorsExhaustedError

logger = logging.getLogger(__name__)

Opener = Callable[[str, int, int], int]

EXHAUSTION_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
"""Out of descriptors (per process or system-wide): a resource limit, not a disk failure."""

DEFAULT_SHARE_OF_LIMIT = 4
"""The cache takes 1/4 of RLIMIT_NOFILE; the rest is for connections and everything else."""

MIN_CAPACITY = 16
_REOPEN_CLEARED = os.O_TRUNC | os.O_EXCL


def is_descriptor_exhaustion(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in EXHAUSTION_ERRNOS


class FileHandle:
    """A file the log uses, opened on demand through its cache. Use `pinned()` to get a
    descriptor; never keep the descriptor past the block."""

    __slots__ = ("_cache", "_fd", "_pins", "closed", "mode", "path", "reopen_flags")

    def __init__(self, cache: FileHandleCache, path: Path, reopen_flags: int, mode: int) -> None:
        self._cache = cache
        self.path = path
        self.reopen_flags = reopen_flags
        self.mode = mode
        self._fd: int | None = None
        self._pins = 0
        self.closed = False

    @property
    def is_open(self) -> bool:
        """It holds a descriptor now (tests and metrics)."""
        return self._fd is not None

    @contextmanager
    def pinned(self) -> Iterator[int]:
        """The descriptor, opened if evicted, not evictable until the block ends."""
        fd = self._cache.pin(self)
        try:
            yield fd
        finally:
            self._cache.unpin(self)

    def pread(self, length: int, position: int) -> bytes:
        with self.pinned() as fd:
            return os.pread(fd, length, position)

    def size(self) -> int:
        with self.pinned() as fd:
            return os.fstat(fd).st_size

    def fsync(self, sync: Callable[[int], None] | None = None) -> None:
        """Make the file durable; a closed handle is reopened by path (a file deleted since
        needs no sync)."""
        self._cache.fsync(self, sync)

    def close(self) -> None:
        """Forget the file (closes its descriptor now, or when the last pin is released)."""
        self._cache.close(self)

    def __repr__(self) -> str:
        return f"FileHandle({str(self.path)!r}, open={self.is_open}, pins={self._pins})"


class FileHandleCache:
    """At most `capacity` descriptors open for unpinned handles (pinned ones may exceed it
    briefly: a pin is short and their number is bounded by concurrent operations)."""

    def __init__(
        self,
        capacity: int,
        *,
        opener: Opener = os.open,
        closer: Callable[[int], None] = os.close,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be positive, not {capacity}")
        self.capacity = capacity
        self._opener = opener
        self._closer = closer
        self._lock = threading.Lock()
        self._idle: OrderedDict[FileHandle, None] = OrderedDict()  # open, unpinned; LRU first
        self._open_count = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @property
    def open_count(self) -> int:
        """Descriptors held now, pinned or not."""
        return self._open_count

    # -- handles --------------------------------------------------------------------------

    def handle(
        self, path: Path, flags: int, mode: int = 0o644, *, reopen_flags: int | None = None
    ) -> FileHandle:
        """A handle on `path`, not opened yet; `flags` are used for every open."""
        return FileHandle(self, Path(path), flags if reopen_flags is None else reopen_flags, mode)

    def open(self, path: Path, flags: int, mode: int = 0o644) -> FileHandle:
        """Open `path` now with `flags` (e.g. O_CREAT | O_TRUNC to create it) and return a
        handle that reopens it later without O_TRUNC / O_EXCL."""
        handle = FileHandle(self, Path(path), flags & ~_REOPEN_CLEARED, mode)
        with self._lock:
            handle._fd = self._open_locked(str(path), flags, mode)
            self._open_count += 1
            self._idle[handle] = None
        return handle

    @contextmanager
    def transient(self, path: Path, flags: int, mode: int = 0o644) -> Iterator[int]:
        """A descriptor for one short operation (a temp file, a directory fsync), opened
        with the same EMFILE handling, closed at the end of the block."""
        with self._lock:
            fd = self._open_locked(str(path), flags, mode)
        try:
            yield fd
        finally:
            self._closer(fd)

    # -- pins -----------------------------------------------------------------------------

    def pin(self, handle: FileHandle) -> int:
        with self._lock:
            if handle.closed:
                raise ValueError(f"{handle.path} was closed")
            fd = handle._fd
            if fd is None:
                self.misses += 1
                fd = self._open_locked(str(handle.path), handle.reopen_flags, handle.mode)
                handle._fd = fd
                self._open_count += 1
            elif handle._pins == 0:
                self.hits += 1
                del self._idle[handle]
            else:
                self.hits += 1
            handle._pins += 1
            return fd

    def unpin(self, handle: FileHandle) -> None:
        with self._lock:
            handle._pins -= 1
            if handle._pins:
                return
            if handle.closed:
                self._close_fd_locked(handle)
            else:
                self._idle[handle] = None
                self._shrink_locked(self.capacity)

    def close(self, handle: FileHandle) -> None:
        with self._lock:
            if handle.closed:
                return
            handle.closed = True
            if handle._fd is not None and handle._pins == 0:
                del self._idle[handle]
                self._close_fd_locked(handle)

    def fsync(self, handle: FileHandle, sync: Callable[[int], None] | None = None) -> None:
        sync = os.fsync if sync is None else sync  # looked up now: tests patch os.fsync
        if not handle.closed:
            try:
                fd = self.pin(handle)
            except ValueError:
                pass  # closed meanwhile: sync by path below
            else:
                try:
                    sync(fd)
                finally:
                    self.unpin(handle)
                return
        try:
            with self.transient(handle.path, handle.reopen_flags & ~os.O_CREAT) as fd:
                sync(fd)
        except FileNotFoundError:
            return  # deleted (retention, DeleteTopics): nothing left to make durable

    def close_all(self) -> None:
        """Close every idle descriptor (tests, shutdown)."""
        with self._lock:
            self._evict_locked(len(self._idle))

    # -- internals (lock held) ------------------------------------------------------------

    def _open_locked(self, path: str, flags: int, mode: int) -> int:
        # Make room first so the cache never holds more than its capacity idle.
        self._shrink_locked(self.capacity - 1)
        try:
            return self._opener(path, flags | os.O_CLOEXEC, mode)
        except OSError as exc:
            if not is_descriptor_exhaustion(exc):
                raise
            first = exc
        # Out of descriptors: give back half of the idle ones, then try once more.
        freed = self._evict_locked(max(1, (len(self._idle) + 1) // 2))
        logger.warning("%s opening %s: closed %d idle log files", first.strerror, path, freed)
        try:
            return self._opener(path, flags | os.O_CLOEXEC, mode)
        except OSError as exc:
            if is_descriptor_exhaustion(exc):
                raise DescriptorsExhaustedError(f"cannot open {path}: {exc.strerror}") from exc
            raise

    def _shrink_locked(self, keep: int) -> None:
        excess = len(self._idle) - max(keep, 0)
        if excess > 0:
            self._evict_locked(excess)

    def _evict_locked(self, count: int) -> int:
        evicted = 0
        while evicted < count and self._idle:
            handle, _ = self._idle.popitem(last=False)
            self._close_fd_locked(handle)
            evicted += 1
        self.evictions += evicted
        return evicted

    def _close_fd_locked(self, handle: FileHandle) -> None:
        fd, handle._fd = handle._fd, None
        if fd is None:
            return
        self._open_count -= 1
        try:
            self._closer(fd)
        except OSError as exc:
            # Writeback errors surface at the next fsync (reopened by path); only log here.
            logger.warning("closing %s: %s", handle.path, exc)


# -- the broker's cache -------------------------------------------------------------------

_default: FileHandleCache | None = None
_default_lock = threading.Lock()


def capacity_for_limit(soft_limit: int, share: int = DEFAULT_SHARE_OF_LIMIT) -> int:
    """The cache's share of a RLIMIT_NOFILE soft limit."""
    return max(MIN_CAPACITY, soft_limit // share)


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit, as the JVM does for Kafka; returns the
    soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            logger.warning("cannot raise the open files limit from %d to %d: %s", soft, hard, exc)
    elif hard == resource.RLIM_INFINITY:
        soft = max(soft, 1 << 20)
    return soft


def configure(capacity: int | None = None) -> FileHandleCache:
    """Install the broker's cache: `capacity` descriptors, or a share of RLIMIT_NOFILE."""
    global _default
    if capacity is None:
        capacity = capacity_for_limit(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    with _default_lock:
        old, _default = _default, FileHandleCache(capacity)
    if old is not None:
        old.close_all()
    logger.debug("log layer keeps at most %d files open", capacity)
    return _default


def file_handles() -> FileHandleCache:
    """The broker-wide cache (sized from RLIMIT_NOFILE on first use)."""
    cache = _default
    if cache is None:
        return configure()
    return cache
