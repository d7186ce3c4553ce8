"""The log layer's bounded descriptor cache: LRU eviction, pins, EMFILE handling, and a log of
thousands of segments that keeps only a handful of files open."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow.broker import storage_failure
from onceflow.log import file_handles
from onceflow.log.config import LogConfig
from onceflow.log.errors import DescriptorsExhaustedError
from onceflow.log.file_handles import FileHandleCache
from onceflow.log.partition_log import PartitionLog
from onceflow.records.batch import iter_batches
from onceflow.records.builder import build_batch


class FakeOpener:
    """Hands out fake descriptors and fails with EMFILE past `limit` open ones."""

    def __init__(self, limit: int = 1 << 30) -> None:
        self.limit = limit
        self.open: set[int] = set()
        self.opened: list[str] = []
        self._next = 100

    def __call__(self, path: str, flags: int, mode: int) -> int:
        if len(self.open) >= self.limit:
            raise OSError(errno.EMFILE, "Too many open files")
        self._next += 1
        self.open.add(self._next)
        self.opened.append(Path(path).name)
        return self._next

    def close(self, fd: int) -> None:
        self.open.remove(fd)


def make_cache(capacity: int, limit: int = 1 << 30) -> tuple[FileHandleCache, FakeOpener]:
    opener = FakeOpener(limit)
    return FileHandleCache(capacity, opener=opener, closer=opener.close), opener


def test_least_recently_used_is_evicted_and_reopened_on_demand() -> None:
    cache, opener = make_cache(2)
    a, b, c = (cache.handle(Path(n), os.O_RDWR) for n in "abc")
    for h in (a, b):
        with h.pinned():
            pass
    with a.pinned():  # a is now more recent than b
        pass
    with c.pinned():
        pass
    assert (a.is_open, b.is_open, c.is_open) == (True, False, True)
    assert len(opener.open) == cache.open_count == 2
    with b.pinned() as fd:
        assert fd in opener.open
    assert opener.opened == ["a", "b", "c", "b"]
    assert not a.is_open  # a was the least recently used one then


def test_a_hit_does_not_reopen() -> None:
    cache, opener = make_cache(4)
    handle = cache.handle(Path("hot"), os.O_RDWR)
    for _ in range(100):
        with handle.pinned():
            pass
    assert opener.opened == ["hot"]
    assert (cache.hits, cache.misses) == (99, 1)


def test_pinned_handles_are_never_evicted() -> None:
    cache, opener = make_cache(1)
    a, b = cache.handle(Path("a"), os.O_RDWR), cache.handle(Path("b"), os.O_RDWR)
    with a.pinned() as fd_a, b.pinned():
        assert fd_a in opener.open  # over capacity while both are pinned
        assert cache.open_count == 2
    assert cache.open_count == 1  # back to capacity once released


def test_close_while_pinned_closes_at_release() -> None:
    cache, opener = make_cache(4)
    handle = cache.handle(Path("a"), os.O_RDWR)
    with handle.pinned() as fd:
        handle.close()
        assert fd in opener.open
    assert opener.open == set()
    with pytest.raises(ValueError, match="closed"):
        handle.pread(1, 0)


def test_emfile_evicts_idle_descriptors_and_retries() -> None:
    cache, opener = make_cache(capacity=10, limit=4)  # the process runs out before the cache
    handles = [cache.handle(Path(f"f{i}"), os.O_RDWR) for i in range(4)]
    for h in handles:
        with h.pinned():
            pass
    assert len(opener.open) == 4
    with cache.handle(Path("new"), os.O_RDWR).pinned() as fd:
        assert fd in opener.open
    assert cache.evictions >= 1
    assert len(opener.open) <= 4


def test_emfile_with_everything_pinned_is_a_typed_error_not_a_storage_failure() -> None:
    cache, opener = make_cache(capacity=10, limit=2)
    a, b = cache.handle(Path("a"), os.O_RDWR), cache.handle(Path("b"), os.O_RDWR)
    with a.pinned(), b.pinned(), pytest.raises(DescriptorsExhaustedError) as caught:
        cache.pin(cache.handle(Path("c"), os.O_RDWR))
    assert not isinstance(caught.value, OSError)
    assert not storage_failure.is_storage_error(caught.value)
    assert cache.open_count == len(opener.open) == 2  # nothing leaked: a and b only


def test_other_open_errors_pass_through() -> None:
    def missing(path: str, flags: int, mode: int) -> int:
        raise FileNotFoundError(errno.ENOENT, "No such file", path)

    cache = FileHandleCache(4, opener=missing)
    with pytest.raises(FileNotFoundError):
        cache.handle(Path("gone"), os.O_RDWR).size()


def test_fsync_of_an_evicted_file_reopens_it(tmp_path: Path) -> None:
    cache = FileHandleCache(1)
    a = cache.open(tmp_path / "a", os.O_RDWR | os.O_CREAT)
    cache.open(tmp_path / "b", os.O_RDWR | os.O_CREAT)
    assert not a.is_open
    synced: list[int] = []
    a.fsync(synced.append)
    assert len(synced) == 1
    a.close()
    a.fsync(synced.append)  # closed, the file still exists: synced by path
    assert len(synced) == 2
    (tmp_path / "a").unlink()
    a.fsync(synced.append)  # deleted: nothing to sync
    assert len(synced) == 2


def test_reopening_never_truncates(tmp_path: Path) -> None:
    cache = FileHandleCache(1)
    a = cache.open(tmp_path / "a", os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    with a.pinned() as fd:
        os.pwrite(fd, b"kept", 0)
    cache.open(tmp_path / "b", os.O_RDWR | os.O_CREAT)  # evicts a
    assert a.pread(4, 0) == b"kept"


# -- the log on top of it -----------------------------------------------------------------------


@pytest.fixture
def small_cache() -> Iterator[FileHandleCache]:
    cache = file_handles.configure(8)
    yield cache
    file_handles.configure()


def _batch(value: bytes, timestamp: int = 1_700_000_000_000) -> bytes:
    return build_batch([(None, value, (), timestamp)])


def _own_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_log_of_thousands_of_segments_keeps_few_files_open(
    tmp_path: Path, small_cache: FileHandleCache
) -> None:
    config = LogConfig(segment_bytes=100)
    before = _own_fds()
    log = PartitionLog.open(tmp_path / "p", config)
    values = [f"v{i}".encode() for i in range(600)]
    for i, value in enumerate(values):
        data = _batch(value)
        log.append(data, list(iter_batches(data)))
        if i % 100 == 99:  # fsyncs of segments whose descriptors were evicted long ago
            ticket = log.prepare_flush()
            assert ticket is not None
            ticket.run()
            log.complete_flush(ticket)
        assert small_cache.open_count <= 8
    assert len(log.segment_base_offsets) == 600
    assert _own_fds() - before <= 8
    read = [b for b in log.read_batches_bytes(0)]
    assert len(read) == 600
    log._abandon()  # a crash: no clean-shutdown marker
    assert _own_fds() <= before
    reopened = PartitionLog.open(tmp_path / "p", config)
    assert _own_fds() - before <= 8
    assert reopened.log_end_offset == 600
    assert len(list(reopened.iter_batch_headers(0))) == 600
    reopened.close()


def test_a_roll_that_meets_emfile_appends_nothing(
    tmp_path: Path, small_cache: FileHandleCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = PartitionLog.open(tmp_path / "p", LogConfig(segment_bytes=100))
    first = _batch(b"first")
    log.append(first, list(iter_batches(first)))
    small_cache.close_all()

    def exhausted(path: str, flags: int, mode: int) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(small_cache, "_opener", exhausted)
    second = _batch(b"second")
    with pytest.raises(DescriptorsExhaustedError):
        log.append(second, list(iter_batches(second)))
    assert log.log_end_offset == 1
    assert len(log.segment_base_offsets) == 1
    assert sorted(p.name for p in (tmp_path / "p").glob("*.log")) == [f"{0:020d}.log"]
    monkeypatch.undo()
    log.append(second, list(iter_batches(second)))  # the retry succeeds once there is room
    assert [b for b in log.read_batches_bytes(0)] == [
        log.read(0, 1).data,
        log.read(1, 1).data,
    ]
    assert log.log_end_offset == 2
    log.close()
