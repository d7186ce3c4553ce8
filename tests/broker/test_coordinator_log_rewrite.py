"""The coordinator logs rewritten at start: the rewritten transaction log replays to the same
state (ids, epochs, open and in-doubt transactions, the producer id high-water mark), a crash
at any step of the rewrite leaves one whole log, and a broker started on long transaction and
offsets logs serves the same state from short ones."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.errors import ErrorCode

from onceflow.broker import coordinator_log
from onceflow.broker.coordinator_log import REWRITE_MIN_RECORDS, CoordinatorLog, should_rewrite
from onceflow.broker.data_dir import open_data_dir
from onceflow.broker.durability import GroupCommitter
from onceflow.broker.embedded import EmbeddedBroker
from onceflow.clock import ManualClock
from onceflow.groups.offsets import OffsetAndMetadata
from onceflow.groups.offsets_record import encode_offset_commit_key, encode_offset_commit_value
from onceflow.txn.coordinator import TransactionCoordinator
from tests.broker.test_confluent_client import create_topic
from tests.eos.conftest import describe_transactions
from tests.txn.test_coordinator_harness import SimulatedBroker

TXN_LOG = "__transaction_state-0"
OFFSETS_LOG = "__consumer_offsets-0"
TP = ("gone", 0)  # a topic the broker does not have: in-doubt markers for it are skipped


def history(transactions: int) -> tuple[list[tuple[bytes, bytes | None]], SimulatedBroker]:
    """A transaction log of many committed and aborted transactions over a few ids, ending
    with one transaction open (txn-1) and one decided but without its markers (txn-2)."""
    sim = SimulatedBroker(clock=ManualClock(int(time.time() * 1000)))  # not expired at start
    producers = [sim.new_producer(f"txn-{i}") for i in range(3)]
    for n in range(transactions):
        producer = producers[n % 3]
        assert sim.add(producer, TP) == {TP: ErrorCode.none}
        assert sim.end(producer, commit=n % 5 != 0) == ErrorCode.none
        sim.write_markers()
    assert sim.add(producers[1], TP) == {TP: ErrorCode.none}
    assert sim.add(producers[2], TP) == {TP: ErrorCode.none}
    assert sim.end(producers[2], commit=True) == ErrorCode.none  # its markers never written
    return sim.log, sim


def write_log(directory: Path, records: list[tuple[bytes, bytes | None]]) -> None:
    log = CoordinatorLog(directory, GroupCommitter(enabled=False), ManualClock())
    for start in range(0, len(records), 500):
        log.append(records[start : start + 500])
    log.close()


def load(directory: Path) -> tuple[TransactionCoordinator, int]:
    """A fresh coordinator loaded from the log, and how many records it replayed."""
    log = CoordinatorLog(directory, GroupCommitter(enabled=False), ManualClock())
    coordinator = TransactionCoordinator(ManualClock())
    replayed = 0
    for batch in log.batches():
        for record in batch.records:
            coordinator.replay(record.key or b"", record.value)
            replayed += 1
    log.close()
    return coordinator, replayed


def written_and_loaded(
    tmp_path: Path,
) -> tuple[Path, list[tuple[bytes, bytes | None]], TransactionCoordinator]:
    """A short history written as a transaction log, and a coordinator loaded from it."""
    records, _ = history(30)
    directory = tmp_path / TXN_LOG
    write_log(directory, records)
    coordinator, _ = load(directory)
    return directory, records, coordinator


def rewrite(directory: Path, records: list[tuple[bytes, bytes | None]]) -> None:
    log = CoordinatorLog(directory, GroupCommitter(enabled=False), ManualClock())
    log.rewrite([(records, None)])
    log.close()


def test_the_rewritten_log_replays_to_the_same_state(tmp_path: Path) -> None:
    records, sim = history(300)
    directory = tmp_path / TXN_LOG
    write_log(directory, records)
    before, replayed = load(directory)
    assert replayed == len(records)
    state = before.state_records()
    assert len(state) == 4  # the producer id block and three transactional ids
    rewrite(directory, state)

    after, replayed = load(directory)
    assert replayed == len(state)
    assert after.state_records() == state
    assert [d.state for d in after.describe(["txn-0", "txn-1", "txn-2"])] == [
        d.state for d in sim.coordinator.describe(["txn-0", "txn-1", "txn-2"])
    ]
    assert after.in_doubt() == before.in_doubt() != []
    # New ids continue past every id handed out before the rewrite.
    fresh = after.init_producer_id("new", 60_000, -1, -1)
    highest = max(before.get(f"txn-{i}").producer_id for i in range(3))  # type: ignore[union-attr]
    assert fresh.response.producer_id > highest


def test_a_crash_before_the_swap_keeps_the_old_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, records, coordinator = written_and_loaded(tmp_path)

    def crash(src: object, dst: object) -> None:
        raise OSError("crashed")

    monkeypatch.setattr(coordinator_log.os, "rename", crash)
    with pytest.raises(OSError):
        rewrite(directory, coordinator.state_records())
    monkeypatch.undo()
    assert (tmp_path / f"{TXN_LOG}.rewritten").exists()  # complete, never swapped in
    reloaded, replayed = load(directory)
    assert replayed == len(records)
    assert reloaded.state_records() == coordinator.state_records()
    assert not (tmp_path / f"{TXN_LOG}.rewritten").exists()


def test_a_crash_between_the_renames_finishes_the_swap_on_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, _, coordinator = written_and_loaded(tmp_path)
    state = coordinator.state_records()
    real_rename = os.rename
    calls: list[object] = []

    def crash_after_first(src: object, dst: object) -> None:
        if calls:
            raise OSError("crashed")
        calls.append(src)
        real_rename(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(coordinator_log.os, "rename", crash_after_first)
    with pytest.raises(OSError):
        rewrite(directory, state)
    monkeypatch.undo()
    assert not directory.exists()  # the old log moved aside, the new one not yet in place
    reloaded, replayed = load(directory)
    assert replayed == len(state)
    assert reloaded.state_records() == state
    assert sorted(p.name for p in tmp_path.iterdir()) == [TXN_LOG]


def test_only_long_logs_are_rewritten() -> None:
    assert not should_rewrite(REWRITE_MIN_RECORDS - 1, 1)
    assert should_rewrite(REWRITE_MIN_RECORDS, 1)
    assert not should_rewrite(REWRITE_MIN_RECORDS * 3, REWRITE_MIN_RECORDS * 2)


def test_a_broker_started_on_a_long_log_serves_its_state_from_a_short_one(
    tmp_path: Path, make_broker: Callable[..., EmbeddedBroker]
) -> None:
    records, sim = history(REWRITE_MIN_RECORDS // 3)
    assert len(records) > REWRITE_MIN_RECORDS
    data_dir = tmp_path / "data"
    open_data_dir(data_dir, node_id=0)  # a broker's data directory, as it makes one
    write_log(data_dir / TXN_LOG, records)
    size_before = log_size(data_dir / TXN_LOG)

    broker = make_broker(data_dir)
    assert log_size(data_dir / TXN_LOG) < size_before / 100
    described = describe_transactions(broker.bootstrap, ["txn-0", "txn-1", "txn-2"])
    assert described["txn-0"].transaction_state in ("CompleteCommit", "CompleteAbort")
    assert described["txn-1"].transaction_state == "Ongoing"
    # The in-doubt commit is completed after the rewrite (its markers go nowhere: no topic).
    assert described["txn-2"].transaction_state in ("PrepareCommit", "CompleteCommit")
    old = sim.coordinator.get("txn-0")
    assert old is not None and described["txn-0"].producer_id == old.producer_id

    # The id's next instance bumps the rewritten epoch and works as usual.
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "txn-0"})
    producer.init_transactions(30)
    after = describe_transactions(broker.bootstrap, ["txn-0"])["txn-0"]
    assert (after.producer_id, after.producer_epoch) == (old.producer_id, old.producer_epoch + 1)


def log_size(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.iterdir())


def test_a_broker_started_on_a_long_offsets_log_keeps_the_last_commits(
    tmp_path: Path, make_broker: Callable[..., EmbeddedBroker]
) -> None:
    commits = REWRITE_MIN_RECORDS // 4 + 1
    now = int(time.time() * 1000)  # not expired by offsets.retention.minutes
    records = [
        (
            encode_offset_commit_key(group, "t", p),
            encode_offset_commit_value(OffsetAndMetadata(n, commit_timestamp_ms=now)),
        )
        for n in range(commits)
        for group in ("g1", "g2")
        for p in (0, 1)
    ]
    data_dir = tmp_path / "data"
    open_data_dir(data_dir, node_id=0)  # a broker's data directory, as it makes one
    write_log(data_dir / OFFSETS_LOG, records)
    size_before = log_size(data_dir / OFFSETS_LOG)

    broker = make_broker(data_dir)
    assert log_size(data_dir / OFFSETS_LOG) < size_before / 100
    create_topic(broker.bootstrap, "t", 2)
    for group in ("g1", "g2"):
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
        try:
            found = consumer.committed([TopicPartition("t", 0), TopicPartition("t", 1)], 30)
        finally:
            consumer.close()
        assert [tp.offset for tp in found] == [commits - 1, commits - 1]
