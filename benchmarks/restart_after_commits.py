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

import io
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

from kio.serial import entity_writer
from tests.admin_requests import fetch_committed_offset
from tests.broker.offset_commits import offset_commit_request
from tests.confluent import create_topic

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.broker.log_cleaner import CHECKPOINT_FILE, read_checkpoints
from onceflow.records.batch import iter_batches
from onceflow.txn.coordinator import OFFSETS_TOPIC

GROUPS = 4
PARTITIONS = 4
TOPIC = "bench"
WINDOW = 256  # requests in flight per connection
OFFSETS_DIR = f"{OFFSETS_TOPIC}-0"


def frame(request: object, correlation_id: int) -> bytes:
    header_cls = request.__header_schema__  # type: ignore[attr-defined]
    header = header_cls(
        request_api_key=request.__api_key__,  # type: ignore[attr-defined]
        request_api_version=request.__version__,  # type: ignore[attr-defined]
        correlation_id=correlation_id,
        client_id="bench",
    )
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header)
    entity_writer(type(request))(buf, request)
    return struct.pack(">i", buf.tell()) + buf.getvalue()


def read_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        out += chunk
    return bytes(out)


def commit_many(bootstrap: str, group: str, commits: int) -> None:
    """`commits` OffsetCommit requests of every partition, WINDOW in flight at a time.
    (Responses are counted, not parsed: the committed offsets are checked after the restart.)"""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sent = received = 0
        while received < commits:
            batch = bytearray()
            while sent < commits and sent - received < WINDOW:
                request = offset_commit_request(
                    group, TOPIC, dict.fromkeys(range(PARTITIONS), sent)
                )
                batch += frame(request, sent)
                sent += 1
            sock.sendall(batch)
            while received < sent and (sent == commits or sent - received >= WINDOW // 2):
                size = struct.unpack(">i", read_exact(sock, 4))[0]
                read_exact(sock, size)
                received += 1


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
            per_group = commits // GROUPS // PARTITIONS  # requests per group
            started = time.monotonic()
            threads = [
                threading.Thread(target=commit_many, args=(broker.bootstrap, f"g{g}", per_group))
                for g in range(GROUPS)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
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
                found = fetch_committed_offset(broker.bootstrap, "g0", (TOPIC, p), False)
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
