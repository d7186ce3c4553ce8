"""Loading a partition directory: trust what was cleanly closed or flushed, recover the rest.

After a clean shutdown (marker present) every segment's indexes are loaded and sanity-checked.
Otherwise every segment from the recovery point on, and always the last one, is CRC-scanned
and cut after its last valid batch. A segment that does not end where the next one starts
(a torn non-durable segment followed by newer ones) ends the log: the later segments are
deleted so that offsets stay contiguous. Unusable index files are rebuilt either way.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from onceflow.log.config import LogConfig
from onceflow.log.file_handles import FileHandle, file_handles
from onceflow.log.recovery_point import RecoveryPointFile
from onceflow.log.segment import (
    LOG_SUFFIX,
    Segment,
    delete_segment_files,
    parse_segment_file_name,
)
from onceflow.log.swap import resolve_swaps
from onceflow.log.sync_barrier import SyncBarrier

logger = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".clean-shutdown"


@dataclass
class LoadedSegments:
    segments: list[Segment]
    clean: bool
    recovered: list[Segment] = field(default_factory=list)  # scanned/rewritten, not yet synced
    files_changed: bool = False  # files were created or deleted: the directory needs a sync


def load_segments(directory: Path, config: LogConfig, now: int) -> LoadedSegments:
    clean = (directory / CLEAN_SHUTDOWN_FILE).exists()
    recovery_point = 0 if clean else RecoveryPointFile.read(directory)
    bases, files_changed = _sweep(directory)
    result = LoadedSegments(segments=[], clean=clean, files_changed=files_changed)
    for i, base in enumerate(bases):
        next_base = bases[i + 1] if i + 1 < len(bases) else None
        segment = Segment.open_existing(directory, base, config, now)
        durable = clean or (next_base is not None and next_base <= recovery_point)
        if not (durable and segment.load(config, next_base)):
            segment.recover(config, next_base)
            result.recovered.append(segment)
        result.segments.append(segment)
        if next_base is not None and segment.next_offset != next_base:
            logger.error(
                "%s ends at offset %d but the next segment starts at %d: "
                "deleting the %d later segment(s) to keep offsets contiguous",
                segment.log_path,
                segment.next_offset,
                next_base,
                len(bases) - i - 1,
            )
            for later in bases[i + 1 :]:
                delete_segment_files(directory, later)
            result.files_changed = True
            break
    if not result.segments:
        result.segments.append(Segment.create(directory, 0, config, now))
        result.files_changed = True
    return result


def _sweep(directory: Path) -> tuple[list[int], bool]:
    """Base offsets of the segments present; removes temp files and orphaned index files."""
    bases: set[int] = set()
    others: list[tuple[int, Path]] = []
    changed = resolve_swaps(directory)
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.endswith(".tmp"):
                Path(entry.path).unlink(missing_ok=True)
                changed = True
                continue
            parsed = parse_segment_file_name(entry.name)
            if parsed is None:
                continue
            if parsed[1] == LOG_SUFFIX:
                bases.add(parsed[0])
            else:
                others.append((parsed[0], Path(entry.path)))
    for base, path in others:
        if base not in bases:
            # Retention unlinks the .log first; a crash can leave its indexes behind.
            logger.warning("removing orphaned index file %s", path)
            path.unlink(missing_ok=True)
            changed = True
    return sorted(bases), changed


def write_clean_shutdown_marker(
    directory: Path, directory_file: FileHandle, barrier: SyncBarrier | None = None
) -> None:
    """Only once everything of the log is durable; with a `barrier`, the marker is made
    durable when the caller syncs it (a stop of thousands of logs: one sync, not two each)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    with file_handles().transient(directory / CLEAN_SHUTDOWN_FILE, flags) as fd:
        if barrier is None:
            os.fsync(fd)
    if barrier is None:
        directory_file.fsync()
    else:
        barrier.defer(directory_file)


def remove_clean_shutdown_marker(
    directory: Path, directory_file: FileHandle, barrier: SyncBarrier | None = None
) -> None:
    """Must be durable before the first append: a stale marker would skip the next recovery
    (with a `barrier`, the caller passes it before appending)."""
    (directory / CLEAN_SHUTDOWN_FILE).unlink(missing_ok=True)
    if barrier is None:
        directory_file.fsync()
    else:
        barrier.defer(directory_file)
