"""The internal logs (`__consumer_offsets`, `__transaction_state`) compacted by the log cleaner
while the broker runs, as Kafka compacts them: the offsets log after many commits of a few
groups holds about its live keys, a kill -9 at each step of a clean restarts to every committed
offset and every transactional id's state, an aborted transaction's offset commits never come
back, an open transaction's survive (and commit afterwards), and a data directory left by an
older broker mid-rewrite still loads."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.errors import ErrorCode

from onceflow.broker.data_dir import open_data_dir
from onceflow.broker.embedded import EmbeddedBroker
from onceflow.broker.log_cleaner import CHECKPOINT_FILE, read_checkpoints
from onceflow.fault_points import POINTS
from onceflow.log.segment import LOG_SUFFIX
from onceflow.records.batch import iter_batches
from onceflow.txn.coordinator import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from tests.admin_requests import connect, describe_transactions, end_txn, fetch_committed_offset
from tests.broker.offset_commits import commit
from tests.confluent import create_topic, transactional_producer
from tests.waiting import wait_for

SEGMENT_BYTES = "4096"
SETTINGS = {
    "offsets.topic.segment.bytes": SEGMENT_BYTES,
    "transaction.state.log.segment.bytes": SEGMENT_BYTES,
    "log.cleaner.backoff.ms": "50",
    "log.cleaner.min.cleanable.ratio": "0.01",
    "group.initial.rebalance.delay.ms": "0",
}
NO_CLEANER = {**SETTINGS, "log.cleaner.enable": "false"}
OFFSETS_DIR = f"{OFFSETS_TOPIC}-0"
TXN_DIR = f"{TRANSACTION_STATE_TOPIC}-0"
TOPIC = "t"
GROUPS = ("g1", "g2")


def checkpoint(data_dir: Path, directory: str) -> int:
    topic, _, partition = directory.rpartition("-")
    return read_checkpoints(data_dir / CHECKPOINT_FILE).get((topic, int(partition)), 0)


def data_records(directory: Path, below: int | None = None) -> list[tuple[int, int, bool]]:
    """(base offset, record count, transactional) of every data batch in the log's segment
    files (below an offset), read offline."""
    found = []
    for path in sorted(directory.glob(f"*{LOG_SUFFIX}")):
        for _, h in iter_batches(path.read_bytes()):
            if not h.is_control and (below is None or h.base_offset < below):
                found.append((h.base_offset, h.records_count, h.is_transactional))
    return found


def commit_rounds(bootstrap: str, rounds: int, start: int = 0) -> dict[tuple[str, int], int]:
    """`rounds` commits of both partitions by every group; the last offset of each."""
    with connect(bootstrap) as connection:
        for n in range(start, start + rounds):
            for group in GROUPS:
                commit(connection, group, TOPIC, {0: n, 1: n + 1})
    last = start + rounds - 1
    return {(g, p): last + p for g in GROUPS for p in (0, 1)}


def broker_with_topic(
    make_broker: Callable[..., EmbeddedBroker], data: Path, settings: dict[str, str]
) -> EmbeddedBroker:
    """A broker of the test's own on `data`, with TOPIC's two partitions to commit offsets of."""
    broker = make_broker(data, settings=settings)
    create_topic(broker.bootstrap, TOPIC, 2)
    return broker


def committed(bootstrap: str, group: str, partitions: int = 2) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = consumer.committed([TopicPartition(TOPIC, p) for p in range(partitions)], 30)
    finally:
        consumer.close()
    return [tp.offset for tp in found]


def test_the_offsets_log_is_compacted_while_running_and_loads_after_kill_9(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    broker = broker_with_topic(make_broker, data, SETTINGS)
    rounds = 300
    last = commit_rounds(broker.bootstrap, rounds)
    written = 2 * len(GROUPS) * rounds
    # Everything but the active segment (a few dozen records at 4 KiB) gets cleaned.
    wait_for(lambda: checkpoint(data, OFFSETS_DIR) >= written - 100, what="the offsets log cleaned")
    broker.kill()

    clean_point = checkpoint(data, OFFSETS_DIR)
    below = sum(c for _, c, _ in data_records(data / OFFSETS_DIR, clean_point))
    assert below <= len(last), f"{below} records below the clean point, {len(last)} live keys"
    total = sum(c for _, c, _ in data_records(data / OFFSETS_DIR))
    assert total <= len(last) + written - clean_point < written / 10

    broker.restart()
    for group in GROUPS:
        assert committed(broker.bootstrap, group) == [last[(group, 0)], last[(group, 1)]]


def send_offsets(
    bootstrap: str, producer: Producer, group: str, offsets: dict[int, int], commit: bool
) -> None:
    """A transaction that commits (or leaves open) only consumer offsets."""
    producer.begin_transaction()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        metadata = consumer.consumer_group_metadata()
    finally:
        consumer.close()
    producer.send_offsets_to_transaction(
        [TopicPartition(TOPIC, p, o) for p, o in offsets.items()], metadata, 30
    )
    if commit:
        producer.commit_transaction(30)


TXN_IDS = ("tx-commit", "tx-abort", "tx-open")


class History:
    """Offsets and transactions written with the cleaner off: plain commits, committed and
    aborted transactional commits, then one transaction left open with more commits after it."""

    def __init__(self, bootstrap: str) -> None:
        self.plain = commit_rounds(bootstrap, 100)
        committer = transactional_producer(bootstrap, "tx-commit")
        aborter = transactional_producer(bootstrap, "tx-abort")
        with connect(bootstrap) as connection:
            commit(connection, "ga", TOPIC, {0: 5, 1: 5})
        for n in range(15):
            send_offsets(bootstrap, committer, "gt", {0: 100 + n, 1: 200 + n}, commit=True)
            send_offsets(bootstrap, aborter, "ga", {0: 1000 + n, 1: 2000 + n}, commit=False)
            aborter.abort_transaction(30)
        self.plain = commit_rounds(bootstrap, 100, start=100)
        # open across every restart of every test of the module: Kafka's longest timeout
        open_producer = transactional_producer(
            bootstrap, "tx-open", **{"transaction.timeout.ms": 900_000}
        )
        send_offsets(bootstrap, open_producer, "go", {0: 777, 1: 778}, commit=False)
        self.plain = commit_rounds(bootstrap, 100, start=200)
        self.txns = describe_transactions(bootstrap, TXN_IDS)
        assert self.txns["tx-open"].transaction_state == "Ongoing"
        assert self.txns["tx-abort"].transaction_state == "CompleteAbort"

    def commit_the_open_transaction(self, bootstrap: str) -> None:
        """EndTxn as its producer would send it (the producer itself stayed with the broker
        that wrote the history: each test restarts a copy of its data directory)."""
        state = self.txns["tx-open"]
        commit = end_txn(bootstrap, "tx-open", state.producer_id, state.producer_epoch, True)
        assert commit == ErrorCode.none

    def check(self, bootstrap: str) -> None:
        """Every committed offset, the aborted ones absent, the open transaction's pending,
        every transactional id's state as it was."""
        for group in GROUPS:
            assert committed(bootstrap, group) == [self.plain[(group, p)] for p in (0, 1)]
        assert committed(bootstrap, "gt") == [114, 214]
        assert committed(bootstrap, "ga") == [5, 5]
        for p in (0, 1):
            assert fetch_committed_offset(bootstrap, "go", (TOPIC, p), False) == (
                ErrorCode.none,
                -1,
            )
            stable = fetch_committed_offset(bootstrap, "go", (TOPIC, p), True)
            assert stable[0] == ErrorCode.unstable_offset_commit
        assert describe_transactions(bootstrap, TXN_IDS) == self.txns


def both_logs_cleaned(data: Path) -> bool:
    return checkpoint(data, OFFSETS_DIR) > 0 and checkpoint(data, TXN_DIR) > 0


CRASH_POINTS = sorted(p for p in POINTS if p.startswith("cleaner."))


@pytest.fixture(scope="module")
def written_history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, History]:
    """The History written once, with the cleaner off, by a broker killed -9 afterwards: each
    crash point's test starts a broker on a copy of its data directory."""
    data = tmp_path_factory.mktemp("history") / "data"
    broker = EmbeddedBroker(data, settings=NO_CLEANER).start()
    try:
        create_topic(broker.bootstrap, TOPIC, 2)
        history = History(broker.bootstrap)
    finally:
        broker.kill()
    return data, history


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_kill_9_mid_clean_of_the_internal_logs_restores_offsets_and_transactions(
    make_broker: Callable[..., EmbeddedBroker],
    tmp_path: Path,
    point: str,
    written_history: tuple[Path, History],
) -> None:
    data = tmp_path / "data"
    shutil.copytree(written_history[0], data)
    history = written_history[1]
    broker = make_broker(data, settings=SETTINGS, env={"ONCEFLOW_CRASH_AT": point})
    wait_for(lambda: broker.process.poll() is not None, what=f"the crash at {point}")

    broker.settings, broker.env = NO_CLEANER, {}
    broker.restart()
    history.check(broker.bootstrap)
    broker.kill()

    broker.settings = SETTINGS
    broker.restart()
    wait_for(lambda: both_logs_cleaned(data), what="both internal logs cleaned")
    broker.kill()
    broker.restart()
    history.check(broker.bootstrap)

    # The open transaction's offsets survived the cleans: committing makes them visible.
    history.commit_the_open_transaction(broker.bootstrap)
    assert committed(broker.bootstrap, "go") == [777, 778]
    assert committed(broker.bootstrap, "ga") == [5, 5]


def test_an_aborted_transactions_offset_commits_are_removed_by_the_clean(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    broker = broker_with_topic(make_broker, data, NO_CLEANER)
    aborter = transactional_producer(broker.bootstrap, "tx-abort")
    for n in range(20):
        send_offsets(broker.bootstrap, aborter, "ga", {0: 1000 + n, 1: 2000 + n}, commit=False)
        aborter.abort_transaction(30)
    commit_rounds(broker.bootstrap, 100)
    broker.kill()
    aborted = [c for _, c, transactional in data_records(data / OFFSETS_DIR) if transactional]
    assert sum(aborted) == 40

    broker.settings = SETTINGS
    broker.restart()
    wait_for(lambda: checkpoint(data, OFFSETS_DIR) > 0, what="the offsets log cleaned")
    broker.kill()
    below = data_records(data / OFFSETS_DIR, checkpoint(data, OFFSETS_DIR))
    assert sum(c for _, c, transactional in below if transactional) == 0
    assert sum(c for _, c, _ in below) <= 2 * len(GROUPS)  # the plain commits' live keys
    broker.restart()
    assert committed(broker.bootstrap, "ga") == [-1001, -1001]


def test_an_interrupted_rewrite_left_by_an_older_broker_is_finished_or_dropped(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    """An older broker rewrote these logs at start through `<log>.rewritten` and
    `<log>.replaced`: killed between its two renames, the new log takes the old one's place."""
    data = tmp_path / "data"
    broker = broker_with_topic(make_broker, data, NO_CLEANER)
    last = commit_rounds(broker.bootstrap, 5)
    broker.stop()
    offsets = data / OFFSETS_DIR
    offsets.rename(data / f"{OFFSETS_DIR}.rewritten")  # the complete new log
    (data / f"{OFFSETS_DIR}.replaced").mkdir()  # the old one, moved aside
    txn_leftover = data / f"{TXN_DIR}.rewritten"  # a rewrite cut short before its swap
    txn_leftover.mkdir()

    broker.restart()
    for group in GROUPS:
        assert committed(broker.bootstrap, group) == [last[(group, 0)], last[(group, 1)]]
    names = sorted(p.name for p in data.iterdir() if p.name.startswith("__"))
    assert names == [OFFSETS_DIR, TXN_DIR]
    open_data_dir(data, node_id=0)  # still a broker's data directory
