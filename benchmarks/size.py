"""How long a broker with many partitions, or a long offsets log, takes to start, create and stop.

    python benchmarks/size.py [--partitions 12000] [--create 10000] [--commits 438000]
                              [--only restart,create,commits] [--profile DIR]

The broker it starts is the `onceflow` package on PYTHONPATH, so the same script measures two
checkouts: `PYTHONPATH=OTHER/src python benchmarks/size.py`. Every broker is a fresh embedded
one (fsync on) in a temporary directory. Situations (issue 19, item 8):

- restart: topics of `--partitions` partitions in all (at most 4,000 a topic), one small batch
  written to each; `kill -9`; then the time from starting the process to its first Metadata
  answer (and to its ready line); one more batch to each partition; SIGTERM and the time to
  exit; a start after that clean stop, timed the same way.
- create: one CreateTopics of `--create` partitions, its time, and the worst Metadata
  latency another connection saw meanwhile (polled every 20 ms).
- commits: `--commits` offset commits (benchmarks/restart_after_commits.py's pipelined
  OffsetCommits of 4 groups x 4 partitions), `kill -9`, then the time from starting the
  process to its first Metadata answer and to the first OffsetFetch that returns the last
  committed offset (retried while the broker answers COORDINATOR_LOAD_IN_PROGRESS).

With `--profile DIR`, each broker started runs under cProfile (`python -m cProfile -o`), its
profile written to DIR/SITUATION-N.prof when it exits (SIGTERM; a killed broker leaves none, so
a restarted broker is stopped once it answered; read them with `python -m pstats`).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from kio.schema.create_topics.v5.request import CreatableTopic, CreateTopicsRequest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
from kio.schema.offset_fetch.v7.request import OffsetFetchRequest, OffsetFetchRequestTopic
from kio.schema.produce.v8.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i16, i32, i32Timedelta

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.protocol.client import BrokerConnection, KafkaClientError
from onceflow.records.builder import build_batch

sys.path[:0] = [str(Path(__file__).parent)]  # restart_after_commits, run as a script or not
from restart_after_commits import (  # noqa: E402
    GROUPS,
    PARTITIONS,
    TOPIC,
    commit_from_groups,
)

TOPIC_PARTITIONS = 4_000  # partitions per topic in the restart situation
PRODUCE_CHUNK = 1_000  # partitions per Produce request
POLL_S = 0.01


def connect(port: int, timeout: float = 300.0) -> BrokerConnection:
    return BrokerConnection.connect(
        "127.0.0.1", port, connect_timeout_s=1.0, request_timeout_s=timeout, client_id="size"
    )


def metadata(connection: BrokerConnection, topic: str) -> None:
    request = MetadataRequest(
        topics=(MetadataRequestTopic(name=TopicName(topic)),),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    connection.send(request)


class Restart:
    """Start a broker in a thread and time, from the process start, its first answers."""

    def __init__(self, broker: EmbeddedBroker) -> None:
        self.broker = broker
        self.started = time.monotonic()
        self.ready_at: float | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            self.broker.start(timeout=1200)
            self.ready_at = time.monotonic() - self.started
        except BaseException as e:  # reported by the caller
            self.error = e

    def first_answer(self, ask: object, deadline_s: float = 1200) -> float:
        """Seconds from the start until `ask(connection)` returns True."""
        deadline = self.started + deadline_s
        connection: BrokerConnection | None = None
        while time.monotonic() < deadline:
            if self.error is not None:
                raise self.error
            try:
                if connection is None:
                    connection = connect(self.broker.port)
                if ask(connection):  # type: ignore[operator]
                    connection.close()
                    return time.monotonic() - self.started
            except (KafkaClientError, OSError):
                if connection is not None:
                    connection.close()
                connection = None
            time.sleep(POLL_S)
        raise TimeoutError("no answer")

    def join(self) -> float:
        self._thread.join()
        if self.error is not None:
            raise self.error
        assert self.ready_at is not None
        return self.ready_at


def produce_one_each(port: int, topics: dict[str, int], round_: int) -> None:
    """One small batch (acks=all) to every partition, PRODUCE_CHUNK partitions a request."""
    batch = build_batch([(None, b"v%d" % round_, (), int(time.time() * 1000))])
    pairs = [(t, p) for t, n in topics.items() for p in range(n)]
    with connect(port) as connection:
        for i in range(0, len(pairs), PRODUCE_CHUNK):
            by_topic: dict[str, list[int]] = {}
            for t, p in pairs[i : i + PRODUCE_CHUNK]:
                by_topic.setdefault(t, []).append(p)
            request = ProduceRequest(
                transactional_id=None,
                acks=i16(-1),
                timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)),
                topic_data=tuple(
                    TopicProduceData(
                        name=TopicName(t),
                        partition_data=tuple(
                            PartitionProduceData(index=i32(p), records=batch) for p in ps
                        ),
                    )
                    for t, ps in by_topic.items()
                ),
            )
            response = connection.send(request)
            errors = {p.error_code for r in response.responses for p in r.partition_responses}
            assert errors == {ErrorCode.none}, errors


def create_topics(port: int, topics: dict[str, int]) -> float:
    """One CreateTopics request; its seconds."""
    request = CreateTopicsRequest(
        topics=tuple(
            CreatableTopic(
                name=TopicName(name),
                num_partitions=i32(n),
                replication_factor=i16(1),
                assignments=(),
                configs=(),
            )
            for name, n in topics.items()
        ),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=1200)),
        validate_only=False,
    )
    with connect(port, timeout=1200) as connection:
        started = time.monotonic()
        response = connection.send(request)
        elapsed = time.monotonic() - started
    errors = {t.error_code for t in response.topics}
    assert errors == {ErrorCode.none}, [
        (t.name, t.error_code, t.error_message) for t in response.topics
    ]
    return elapsed


class ProfiledBroker(EmbeddedBroker):
    """An embedded broker run under cProfile: one profile per start, written at a clean exit."""

    def __init__(self, data_dir: Path, profile: Path, name: str) -> None:
        super().__init__(data_dir)
        self.profile = profile
        self.name = name
        self.starts = 0

    def start(self, timeout: float = 30.0) -> EmbeddedBroker:
        self.starts += 1
        out = self.profile / f"{self.name}-{self.starts}.prof"
        wrapper = self.profile / f"python-{self.name}-{self.starts}"
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m cProfile -o {out} "$@"\n')
        wrapper.chmod(0o755)
        executable, sys.executable = sys.executable, str(wrapper)
        try:
            return super().start(timeout)
        finally:
            sys.executable = executable


def make_broker(data_dir: Path, profile: Path | None, name: str) -> EmbeddedBroker:
    if profile is not None:
        return ProfiledBroker(data_dir, profile, name)
    return EmbeddedBroker(data_dir)


def timed_stop(broker: EmbeddedBroker) -> float:
    started = time.monotonic()
    code = broker.stop(timeout=1200)
    elapsed = time.monotonic() - started
    assert code == 0, f"exit code {code}"
    return elapsed


def restart_situation(partitions: int, profile: Path | None) -> None:
    topics: dict[str, int] = {}
    left = partitions
    while left > 0:
        topics[f"t{len(topics)}"] = min(left, TOPIC_PARTITIONS)
        left -= TOPIC_PARTITIONS
    print(f"restart: {partitions} partitions in {len(topics)} topics", flush=True)
    with tempfile.TemporaryDirectory(prefix="size-bench-") as tmp:
        broker = make_broker(Path(tmp) / "data", profile, "restart")
        try:
            broker.start(timeout=1200)
            started = time.monotonic()
            for name, n in topics.items():
                create_topics(broker.port, {name: n})
            print(f"  created in {time.monotonic() - started:.1f}s", flush=True)
            produce_one_each(broker.port, topics, 1)
            broker.kill()
            restart = Restart(broker)
            answered = restart.first_answer(lambda c: metadata(c, "t0") or True)
            ready = restart.join()
            print(
                f"  after kill -9: Metadata answered {answered:.2f}s, ready line {ready:.2f}s",
                flush=True,
            )
            produce_one_each(broker.port, topics, 2)
            print(f"  SIGTERM to exit: {timed_stop(broker):.2f}s", flush=True)
            restart = Restart(broker)
            answered = restart.first_answer(lambda c: metadata(c, "t0") or True)
            ready = restart.join()
            print(
                f"  after SIGTERM: Metadata answered {answered:.2f}s, ready line {ready:.2f}s",
                flush=True,
            )
            if profile is not None:
                timed_stop(broker)
        finally:
            broker.kill()


def create_situation(partitions: int, profile: Path | None) -> None:
    print(f"create: one CreateTopics of {partitions} partitions", flush=True)
    with tempfile.TemporaryDirectory(prefix="size-bench-") as tmp:
        broker = make_broker(Path(tmp) / "data", profile, "create")
        try:
            broker.start(timeout=1200)
            worst = 0.0
            done = threading.Event()

            def victim() -> None:
                nonlocal worst
                with connect(broker.port, timeout=1200) as connection:
                    while not done.is_set():
                        started = time.monotonic()
                        metadata(connection, "absent")
                        worst = max(worst, time.monotonic() - started)
                        time.sleep(0.02)

            thread = threading.Thread(target=victim, daemon=True)
            thread.start()
            elapsed = create_topics(broker.port, {"big": partitions})
            done.set()
            thread.join()
            print(
                f"  CreateTopics answered in {elapsed:.2f}s; "
                f"worst Metadata latency meanwhile {worst * 1000:.0f} ms",
                flush=True,
            )
            if profile is not None:
                timed_stop(broker)
        finally:
            broker.kill()


def commits_situation(commits: int, profile: Path | None) -> None:
    print(f"commits: {commits} offset commits, then kill -9", flush=True)
    with tempfile.TemporaryDirectory(prefix="size-bench-") as tmp:
        broker = make_broker(Path(tmp) / "data", profile, "commits")
        try:
            broker.start(timeout=1200)
            create_topics(broker.port, {TOPIC: PARTITIONS})
            started = time.monotonic()
            per_group = commit_from_groups(broker.bootstrap, commits)
            total = per_group * GROUPS * PARTITIONS
            print(f"  {total} commits in {time.monotonic() - started:.1f}s", flush=True)
            broker.kill()
            restart = Restart(broker)

            def fetched(connection: BrokerConnection) -> bool:
                request = OffsetFetchRequest(
                    group_id=GroupId("g0"),
                    topics=(
                        OffsetFetchRequestTopic(name=TopicName(TOPIC), partition_indexes=(i32(0),)),
                    ),
                    require_stable=False,
                )
                response = connection.send(request)
                if response.error_code != ErrorCode.none:
                    return False
                [partition] = response.topics[0].partitions
                assert partition.committed_offset == per_group - 1, partition
                return True

            answered = restart.first_answer(lambda c: metadata(c, TOPIC) or True)
            offsets = restart.first_answer(fetched)
            ready = restart.join()
            print(
                f"  after kill -9: Metadata answered {answered:.2f}s, OffsetFetch answered "
                f"{offsets:.2f}s, ready line {ready:.2f}s",
                flush=True,
            )
            if profile is not None:
                timed_stop(broker)
        finally:
            broker.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=12_000)
    parser.add_argument("--create", type=int, default=10_000)
    parser.add_argument("--commits", type=int, default=438_000)
    parser.add_argument("--only", default="restart,create,commits")
    parser.add_argument("--profile", type=Path, default=None)
    args = parser.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    import onceflow

    print(f"onceflow from {os.path.dirname(onceflow.__file__)}", flush=True)
    only = set(args.only.split(","))
    if "restart" in only:
        restart_situation(args.partitions, args.profile)
    if "create" in only:
        create_situation(args.create, args.profile)
    if "commits" in only:
        commits_situation(args.commits, args.profile)


if __name__ == "__main__":
    main()
