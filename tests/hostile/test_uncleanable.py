"""One compacted partition never stops the log cleaner for the others (issue 19, item 3).

`delete.retention.ms=9223372036854775807` (accepted, as Kafka accepts it) on one compacted topic
made every cleaner round fail on that topic (now + the retention overflowed a varlong), and
being the dirtiest log it was chosen again at every tick: no other compacted topic and not
`__consumer_offsets` was ever compacted again. The horizon now saturates; and, as Kafka's
LogCleanerManager does, a partition whose cleaning fails for any other reason (here a batch
corrupted on disk) is marked uncleanable, said once in the broker's log, and skipped, while
every other partition goes on being cleaned.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.broker.log_cleaner import CHECKPOINT_FILE, read_checkpoints
from onceflow.log.segment import LOG_SUFFIX
from onceflow.records.batch import DELETE_HORIZON_FLAG, iter_batches
from onceflow.records.record import iter_decoded_batches
from onceflow.records.varint import INT64_MAX
from onceflow.txn.coordinator import OFFSETS_TOPIC
from tests.admin_requests import connect
from tests.broker.offset_commits import commit
from tests.confluent import create_topic
from tests.waiting import wait_for, wait_for_line

SETTINGS = {
    "offsets.topic.segment.bytes": "4096",
    "log.cleaner.backoff.ms": "50",
    "log.cleaner.min.cleanable.ratio": "0.01",
}
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.bytes": "1024",
    "min.cleanable.dirty.ratio": "0.01",
}
OFFSETS = (OFFSETS_TOPIC, 0)
COMMITTED_TOPIC = "committed"
GROUPS = ("g1", "g2")
COMMITS = 1_500  # OffsetCommit requests, as in the figures
DEADLINE = 60.0
OFFSETS_LOG_BOUND = 16 * 1024  # bytes, compacted; 250 KiB are written


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]]) -> None:
    """One batch per record (linger 0, acks=all): many small segments to clean."""
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    for key, value in records:
        producer.produce(
            topic, key=key, value=value, on_delivery=lambda e, _m: e and errors.append(e)
        )
        producer.flush(30)
    assert errors == []


def updates(keys: int, rounds: int) -> list[tuple[bytes, bytes | None]]:
    return [(b"k%d" % k, b"v%d" % r) for r in range(rounds) for k in range(keys)]


def offset_commits(bootstrap: str, commits: int) -> None:
    with connect(bootstrap) as connection:
        for n in range(commits):
            commit(connection, GROUPS[n % len(GROUPS)], COMMITTED_TOPIC, {0: n, 1: n})


def segment_files(data: Path, topic: str, partition: int = 0) -> list[Path]:
    return sorted((data / f"{topic}-{partition}").glob(f"*{LOG_SUFFIX}"))


def cleaned_up_to_the_active_segment(data: Path, *partitions: tuple[str, int]) -> bool:
    """The cleaner checkpoint of each partition has reached its active segment (the last
    `.log`, which a round never cleans): all it may clean is clean."""
    checkpoints = read_checkpoints(data / CHECKPOINT_FILE)
    for topic, partition in partitions:
        active = int(segment_files(data, topic, partition)[-1].name.removesuffix(LOG_SUFFIX))
        if checkpoints.get((topic, partition), -1) < active:
            return False
    return True


def state(data: Path, broker: EmbeddedBroker, *partitions: tuple[str, int]) -> Callable[[], str]:
    def describe() -> str:
        checkpoints = read_checkpoints(data / CHECKPOINT_FILE)
        logs = {
            f"{t}-{p}": (len(segment_files(data, t, p)), checkpoints.get((t, p)))
            for t, p in partitions
        }
        errors = [line for line in broker.output if "cleaner" in line][-3:]
        return f"every log cleaned to its active segment: (segments, checkpoint) {logs}; {errors}"

    return describe


def log_bytes(data: Path, topic: str, partition: int = 0) -> int:
    return sum(p.stat().st_size for p in segment_files(data, topic, partition))


def test_delete_retention_ms_max_on_one_topic_leaves_every_log_compacted(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    broker = make_broker(data, settings=SETTINGS, fsync=False)  # durability is not the point
    # created first, never cleaned: the dirtiest log, which the cleaner picks at every tick
    create_topic(
        broker.bootstrap, "forever", **COMPACTED, **{"delete.retention.ms": str(INT64_MAX)}
    )
    create_topic(broker.bootstrap, "other", **COMPACTED)
    create_topic(broker.bootstrap, COMMITTED_TOPIC, 2)
    # a tombstone in the first segment: the first round gives its batch a delete horizon
    produce(broker.bootstrap, "forever", [(b"gone", b"1"), (b"gone", None), *updates(10, 10)])
    produce(broker.bootstrap, "other", updates(10, 10))
    offset_commits(broker.bootstrap, COMMITS)
    logs = [("forever", 0), ("other", 0), OFFSETS]

    wait_for(
        lambda: cleaned_up_to_the_active_segment(data, *logs),
        DEADLINE,
        state(data, broker, *logs),
    )
    # The offsets log holds its 4 live keys, the emptied last batch of each cleaned segment
    # and its active segment: about 2 KiB to 10 KiB by when the last round ran, against 250 KiB
    # written (which it kept, in 60 segments, while the cleaner was stuck on "forever").
    assert log_bytes(data, *OFFSETS) < OFFSETS_LOG_BOUND
    # The tombstone stays, with the saturated horizon: "forever"
    horizons = [
        (d.header.base_timestamp, bool(d.header.attributes & DELETE_HORIZON_FLAG))
        for path in segment_files(data, "forever")
        for d in iter_decoded_batches(path.read_bytes())
        if any(r.key == b"gone" and r.value is None for r in d.records)
    ]
    assert horizons == [(INT64_MAX, True)]
    assert not [line for line in broker.output if "uncleanable" in line or "failed" in line]


def corrupt_first_batch(segment: Path) -> None:
    """Flip the last byte of the segment's first batch (a record's value): its CRC no longer
    matches, as after a bit flip on disk."""
    raw = bytearray(segment.read_bytes())
    _, header = next(iter_batches(raw))
    with segment.open("r+b") as f:
        f.seek(header.size - 1)
        f.write(bytes([raw[header.size - 1] ^ 0xFF]))


def alter_topic(bootstrap: str, topic: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()
    ]
    futures = admin.incremental_alter_configs(
        [ConfigResource("topic", topic, set_config=None, incremental_configs=entries)]
    )
    for future in futures.values():
        future.result(timeout=30)


def warnings_about(broker: EmbeddedBroker, partition: str) -> list[str]:
    return [line for line in broker.output if "uncleanable" in line and partition in line]


def test_a_partition_whose_cleaning_fails_is_skipped_and_every_other_is_cleaned(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    broker = make_broker(data, settings=SETTINGS, fsync=False)  # durability is not the point
    # not cleanable yet (min.compaction.lag.ms: its records are recent), so that nothing
    # rewrites its first segment while the test corrupts it
    create_topic(broker.bootstrap, "rotten", **COMPACTED, **{"min.compaction.lag.ms": "3600000"})
    create_topic(broker.bootstrap, "other", **COMPACTED)
    create_topic(broker.bootstrap, COMMITTED_TOPIC, 2)
    produce(broker.bootstrap, "rotten", updates(10, 10))
    corrupt_first_batch(segment_files(data, "rotten")[0])
    alter_topic(broker.bootstrap, "rotten", **{"min.compaction.lag.ms": "0"})
    # the cleaner meets the corrupt batch (it used to, at every tick, and cleaned nothing else)
    wait_for_line(broker, "CorruptRecordError", DEADLINE, "the cleaner to meet the corrupt batch")

    produce(broker.bootstrap, "other", updates(10, 10))
    offset_commits(broker.bootstrap, COMMITS)
    logs = [("other", 0), OFFSETS]
    wait_for(
        lambda: cleaned_up_to_the_active_segment(data, *logs),
        DEADLINE,
        state(data, broker, *logs),
    )
    assert log_bytes(data, *OFFSETS) < OFFSETS_LOG_BOUND
    # said once, with the partition and the reason, however many ticks went by since
    [warning] = warnings_about(broker, "rotten-0")
    assert "CRC mismatch" in warning, warning
    assert ("rotten", 0) not in read_checkpoints(data / CHECKPOINT_FILE)

    # Altered configs may be the fix: the partition is tried again (and fails again, once).
    alter_topic(broker.bootstrap, "rotten", **{"min.cleanable.dirty.ratio": "0.02"})
    wait_for(lambda: len(warnings_about(broker, "rotten-0")) == 2, DEADLINE, "a second try")
    assert broker.process is not None and broker.process.poll() is None
