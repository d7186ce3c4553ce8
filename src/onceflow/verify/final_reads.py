"""The end of a verify run, straight to the broker: the final read_committed and
read_uncommitted passes over every partition, the wait for the copiers to drain their input,
and the copiers' committed offsets; each recorded in the history for the checker."""

from __future__ import annotations

import time
from functools import partial

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from onceflow.verify.history import (
    FINAL,
    FINAL_READ,
    INFO,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    History,
)
from onceflow.verify.workload import WorkloadSpec, record_committed_offsets, record_poll


def reader(bootstrap: str, group: str, isolation: str) -> Consumer:
    """A consumer of the harness's own: assigned (never joins its group), never commits."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "log_level": 3,
        }
    )


def watermark_probe(bootstrap: str, tag: str) -> Consumer:
    """A read_committed consumer's watermark query answers the last stable offset: the high
    watermark comes from a read_uncommitted one."""
    return reader(bootstrap, f"verify-{tag}-probe", READ_UNCOMMITTED)


def final_pass(
    bootstrap: str,
    workload: WorkloadSpec,
    isolation: str,
    history: History,
    settle_s: float,
    tag: str,
    process: str | None = None,
) -> None:
    """Read every partition from the beginning to its high watermark, recording the polls
    as `process` (by default `final-rc` / `final-ru`); read_committed stops short of the high
    watermark only while a transaction is still open (its LSO), so it waits for that, up to
    settle_s."""
    process = process or f"{FINAL}-{'rc' if isolation == READ_COMMITTED else 'ru'}"
    consumer = reader(bootstrap, f"verify-{tag}-final", isolation)
    probe = watermark_probe(bootstrap, tag)
    tps = [TopicPartition(t, p, OFFSET_BEGINNING) for t, p in workload.all_partitions()]
    consumer.assign(tps)
    deadline = time.monotonic() + settle_s
    ends: dict[tuple[str, int], tuple[int, int]] = {}
    try:
        while True:
            began = time.monotonic()
            messages = consumer.consume(1000, 0.5)
            got = [m for m in messages if m.error() is None]
            if got:
                record_poll(partial(history.append, process), isolation, got, began)
                continue
            ends = _ends(consumer, probe, tps)
            if all(position >= hw for position, hw in ends.values()):
                break
            if time.monotonic() > deadline:
                break
    finally:
        consumer.close()
        probe.close()
    history.append(
        process,
        INFO,
        FINAL_READ,
        {
            "isolation": isolation,
            "partitions": [[t, p, pos, hw] for (t, p), (pos, hw) in sorted(ends.items())],
        },
    )


def _ends(
    consumer: Consumer, probe: Consumer, tps: list[TopicPartition]
) -> dict[tuple[str, int], tuple[int, int]]:
    """(position, high watermark) per partition (the position of a partition not read yet
    is where it was assigned)."""
    positions = {(tp.topic, tp.partition): tp.offset for tp in consumer.position(tps)}
    out = {}
    for tp in tps:
        low, high = probe.get_watermark_offsets(
            TopicPartition(tp.topic, tp.partition), timeout=10, cached=False
        )
        position = positions[(tp.topic, tp.partition)]
        if position < 0:  # nothing read yet: still where it was assigned
            position = tp.offset if tp.offset >= 0 else low
        out[(tp.topic, tp.partition)] = (position, high)
    return out


def wait_drained(bootstrap: str, workload: WorkloadSpec, timeout_s: float, tag: str) -> bool:
    """Wait until the copiers' committed offsets are past every committed input record
    (nothing left for them to copy); False at the deadline."""
    group = reader(bootstrap, workload.copy_group, READ_COMMITTED)  # never joins: OffsetFetch
    deadline = time.monotonic() + timeout_s
    inputs = [TopicPartition(t, p) for t, p in workload.input_partitions()]
    try:
        while time.monotonic() < deadline:
            try:
                committed = group.committed(inputs, timeout=10)
            except KafkaException:
                time.sleep(0.5)
                continue
            starts = {(tp.topic, tp.partition): tp.offset for tp in committed}
            if _nothing_left(bootstrap, workload, starts, tag):
                return True
            time.sleep(1.0)
        return False
    finally:
        group.close()


def _nothing_left(
    bootstrap: str, workload: WorkloadSpec, starts: dict[tuple[str, int], int], tag: str
) -> bool:
    """No committed record from the group's offsets to the high watermark (all settled)."""
    consumer = reader(bootstrap, f"verify-{tag}-drain", READ_COMMITTED)
    probe = watermark_probe(bootstrap, tag)
    tps = [
        TopicPartition(t, p, offset if offset >= 0 else OFFSET_BEGINNING)
        for (t, p), offset in starts.items()
    ]
    consumer.assign(tps)
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            if any(m.error() is None for m in consumer.consume(100, 0.2)):
                return False
            ends = _ends(consumer, probe, tps)
            if all(position >= hw for position, hw in ends.values()):
                return True
        return False
    finally:
        consumer.close()
        probe.close()


def final_offsets(bootstrap: str, workload: WorkloadSpec, history: History) -> None:
    """The copiers' committed offsets at the end, as process `final`."""
    consumer = reader(bootstrap, workload.copy_group, READ_COMMITTED)
    tps = [TopicPartition(t, p) for t, p in workload.input_partitions()]
    try:
        record_committed_offsets(
            partial(history.append, FINAL), consumer, workload.copy_group, tps, 30
        )
    finally:
        consumer.close()


def group_type(bootstrap: str, group: str, timeout_s: float = 30.0) -> str | None:
    """The group's type as the broker lists it (ListGroups v5: `classic` or `consumer`), so a
    run says which protocol its copiers really used; None if the broker does not list it."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    listed = admin.list_consumer_groups(request_timeout=timeout_s).result()
    for listing in listed.valid:
        if listing.group_id == group:
            return listing.type.name.lower()
    return None
