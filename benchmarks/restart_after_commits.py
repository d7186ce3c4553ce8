"""Restart time after kill -9 with many offset commits since the last start, with the internal
logs compacted while the broker runs, and without (`log.cleaner.enable=false`) as the baseline.

    python benchmarks/restart_after_commits.py [COMMITS] [SEGMENT_BYTES]

For each of the two runs: commits COMMITS offsets (default 1,000,000) of 4 groups x 4
partitions (each OffsetCommit request commits a group's 4 partitions, as a consumer
committing its assignment does; raw wire requests, pipelined on one connection per group) to a
fresh embedded broker (fsync on), waits until the cleaner has cleaned every rolled segment of
`__consumer_offsets` (compacted run), kills it with SIGKILL, restarts it and prints the time to
its ready line, the offsets log's size and record count at the restart, and checks the
committed offsets.
SEGMENT_BYTES is `offsets.topic.segment.bytes` (default onceflow's, 10 MiB; Kafka's is 100
MiB): only rolled segments are cleaned, so a restart still replays the active segment.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

from _support import NotLoaded, create_topic, fetch_committed_offset
from _support import commit_many as commit_pipelined

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.broker.log_cleaner import CHECKPOINT_FILE, read_checkpoints
from onceflow.records.batch import iter_batches
from onceflow.txn.coordinator import OFFSETS_TOPIC

GROUPS = 4
PARTITIONS = 4
TOPIC = "bench"
OFFSETS_DIR = f"{OFFSETS_TOPIC}-0"


def commit_many(bootstrap: str, group: str, commits: int) -> None:
    """`commits` OffsetCommit requests of every partition, pipelined on one connection."""
    commit_pipelined(bootstrap, group, commits, TOPIC, PARTITIONS)


def commit_from_groups(bootstrap: str, commits: int) -> int:
    """About `commits` offset commits, from GROUPS groups at once (a connection each); the
    commits each group made of each partition."""
    per_group = commits // GROUPS // PARTITIONS  # requests per group
    threads = [
        threading.Thread(target=commit_many, args=(bootstrap, f"g{g}", per_group))
        for g in range(GROUPS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return per_group


def _committed_once_loaded(bootstrap: str, tp: tuple[str, int]) -> tuple[object, int]:
    """g0's committed offset, asked again while __consumer_offsets is still loading."""
    deadline = time.monotonic() + 600
    while True:
        try:
            return fetch_committed_offset(bootstrap, "g0", tp)
        except NotLoaded:  # COORDINATOR_LOAD_IN_PROGRESS
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def records_and_size(directory: Path) -> tuple[int, int]:
    records = size = 0
    for path in directory.glob("*.log"):
        data = path.read_bytes()
        size += len(data)
        records += sum(h.records_count for _, h in iter_batches(data))
    return records, size


def cleaned_up_to_active_segment(data_dir: Path) -> bool:
    bases = [int(p.name.split(".")[0]) for p in (data_dir / OFFSETS_DIR).glob("*.log")]
    checkpoint = read_checkpoints(data_dir / CHECKPOINT_FILE).get((OFFSETS_TOPIC, 0), 0)
    return len(bases) > 1 and checkpoint >= max(bases)


def run(commits: int, segment_bytes: int, compact: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="restart-bench-") as tmp:
        data_dir = Path(tmp) / "data"
        settings = {
            "offsets.topic.segment.bytes": str(segment_bytes),
            "log.cleaner.enable": "true" if compact else "false",
            "log.cleaner.backoff.ms": "1000",
        }
        broker = EmbeddedBroker(data_dir, settings=settings).start()
        try:
            create_topic(broker.bootstrap, TOPIC, PARTITIONS)
            started = time.monotonic()
            per_group = commit_from_groups(broker.bootstrap, commits)
            elapsed = time.monotonic() - started
            total = per_group * GROUPS * PARTITIONS
            print(f"  {total} commits in {elapsed:.1f}s", flush=True)
            if compact:
                deadline = time.monotonic() + 600
                while not cleaned_up_to_active_segment(data_dir):
                    if time.monotonic() > deadline:
                        print("  (the cleaner had not caught up after 600 s)")
                        break
                    time.sleep(0.5)
                print(f"  cleaner caught up {time.monotonic() - started - elapsed:.1f}s later")
            broker.kill()
            records, size = records_and_size(data_dir / OFFSETS_DIR)
            started = time.monotonic()
            broker.start(timeout=600)
            restart = time.monotonic() - started
            print(
                f"  restart to ready: {restart:.2f}s; offsets log {size / 1e6:.1f} MB, "
                f"{records} records",
                flush=True,
            )
            # the last commit of every partition of one group, as written
            for p in range(PARTITIONS):
                found = _committed_once_loaded(broker.bootstrap, (TOPIC, p))
                assert found[1] == per_group - 1, (p, found)
        finally:
            broker.kill()


def main() -> None:
    commits = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    segment_bytes = int(sys.argv[2]) if len(sys.argv) > 2 else 10 * 1024 * 1024
    print(f"{commits} offset commits, offsets.topic.segment.bytes={segment_bytes}")
    for compact in (True, False):
        print("compacted while running:" if compact else "baseline, log.cleaner.enable=false:")
        run(commits, segment_bytes, compact)


if __name__ == "__main__":
    main()
