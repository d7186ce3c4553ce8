"""The scenarios: each drives one exactly-once edge case through a `Run` and leaves its
transcript in `run.steps`. The same function runs against onceflow and Apache Kafka."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from tests.apache_kafka.conformance.run import (
    EARLIEST,
    LATEST,
    MAX_TIMESTAMP,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    Run,
)

Scenario = Callable[[Run], None]


def duplicates_and_out_of_order_sequences(run: Run) -> None:
    """An idempotent producer's retries, gaps, sequences past the five cached batches, a new
    epoch and a stale one."""
    topic = run.create_topic("idem")
    pid, epoch = run.init_producer_id("init")

    def send(label: str, seq: int, values: list[bytes], e: int = epoch) -> None:
        run.produce(label, topic, values, producer_id=pid, producer_epoch=e, base_sequence=seq)

    send("first batch", 0, [b"a", b"b", b"c"])
    send("its retry is a duplicate", 0, [b"a", b"b", b"c"])
    send("next batch", 3, [b"d"])
    send("a gap", 5, [b"f"])
    send("the gap filled", 4, [b"e"])
    send("an older batch again", 0, [b"a", b"b", b"c"])
    send("a sequence that overlaps a batch", 2, [b"c", b"d"])
    for i in range(5):
        send(f"batch {i} of five more", 5 + i, [b"g%d" % i])
    send("a batch no longer cached", 0, [b"a", b"b", b"c"])
    send("a cached sequence with other records", 9, [b"other"])
    run.describe_producers("producer state", topic)
    send("a new epoch not from sequence 0", 3, [b"x"], epoch + 1)
    send("a new epoch from sequence 0", 0, [b"y"], epoch + 1)
    send("the old epoch", 10, [b"z"])
    run.describe_producers("producer state after the bump", topic)
    run.fetch("the log", topic, 0, READ_UNCOMMITTED)


def fencing_by_epoch_and_new_init(run: Run) -> None:
    """A second InitProducerId of the same transactional id while a transaction is open: the
    open transaction is aborted, and every request of the old epoch is fenced."""
    topic = run.create_topic("fence")
    txn = run.name("txn")
    pid, old = run.init_producer_id("init", txn)
    run.add_partitions("add partition", txn, pid, old, topic)
    run.produce(
        "produce",
        topic,
        [b"a", b"b"],
        producer_id=pid,
        producer_epoch=old,
        base_sequence=0,
        transactional_id=txn,
    )
    run.describe_transaction("ongoing", txn)
    pid2, new = run.init_producer_id("a new producer's init", txn)
    run.await_transaction(txn)
    run.describe_transaction("after the new init", txn)
    run.produce(
        "the old epoch produces",
        topic,
        [b"c"],
        producer_id=pid,
        producer_epoch=old,
        base_sequence=2,
        transactional_id=txn,
    )
    run.add_partitions("the old epoch adds a partition", txn, pid, old, topic)
    run.end_txn("the old epoch commits", txn, pid, old, True)
    run.add_partitions("new epoch adds", txn, pid2, new, topic)
    run.produce(
        "new epoch produces",
        topic,
        [b"d"],
        producer_id=pid2,
        producer_epoch=new,
        base_sequence=0,
        transactional_id=txn,
    )
    run.produce(
        "an epoch above the current",
        topic,
        [b"e"],
        producer_id=pid2,
        producer_epoch=new + 1,
        base_sequence=1,
        transactional_id=txn,
    )
    run.end_txn("new epoch commits", txn, pid2, new, True)
    run.await_transaction(txn)
    run.describe_transaction("committed", txn)
    run.describe_producers("producer state", topic)
    run.fetch("read_committed", topic, 0, READ_COMMITTED)
    run.list_offsets("LSO", topic, READ_COMMITTED, LATEST)


def transaction_timeout_then_late_requests(run: Run) -> None:
    """A transaction the coordinator aborts at its timeout; the producer's late Produce, EndTxn
    and its KIP-360 InitProducerId with the epoch it had."""
    topic = run.create_topic("timeout")
    txn = run.name("txn")
    pid, epoch = run.init_producer_id("init", txn, timeout_ms=1000)
    run.add_partitions("add partition", txn, pid, epoch, topic)
    run.produce(
        "produce",
        topic,
        [b"a"],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=0,
        transactional_id=txn,
    )
    run.await_transaction(txn, "CompleteAbort")
    run.describe_transaction("aborted by the coordinator", txn)
    run.produce(
        "late produce",
        topic,
        [b"b"],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=1,
        transactional_id=txn,
    )
    run.end_txn("late commit", txn, pid, epoch, True)
    run.end_txn("late abort", txn, pid, epoch, False)
    run.add_partitions("late add partition", txn, pid, epoch, topic)
    run.fetch("read_committed", topic, 0, READ_COMMITTED)
    run.fetch("read_uncommitted", topic, 0, READ_UNCOMMITTED)
    run.init_producer_id(
        "init with the old epoch (KIP-360)",
        txn,
        timeout_ms=1000,
        producer_id=pid,
        producer_epoch=epoch,
    )
    run.describe_transaction("after the re-init", txn)
    run.describe_producers("producer state", topic)


def txn_offset_commit_with_stale_generation(run: Run) -> None:
    """AddOffsetsToTxn and TxnOffsetCommit of a consumer group member whose generation moved."""
    topic = run.create_topic("input")
    group = run.name("group")
    txn = run.name("txn")
    answer = run.join_group("join without member id", group)
    member, generation = run.join_group("join", group, answer[0])
    run.sync_group("sync", group, member, generation)
    run.describe_group("stable", group)
    pid, epoch = run.init_producer_id("init", txn)
    run.add_offsets("add offsets", txn, pid, epoch, group)
    run.txn_offset_commit(
        "commit in the current generation",
        txn,
        pid,
        epoch,
        group,
        topic,
        5,
        generation_id=generation,
        member_id=member,
    )
    member, generation2 = run.join_group("rejoin", group, member)
    run.sync_group("sync again", group, member, generation2)
    run.txn_offset_commit(
        "commit in the stale generation",
        txn,
        pid,
        epoch,
        group,
        topic,
        6,
        generation_id=generation,
        member_id=member,
    )
    run.txn_offset_commit(
        "commit of an unknown member",
        txn,
        pid,
        epoch,
        group,
        topic,
        7,
        generation_id=generation2,
        member_id="unknown-member",
    )
    run.txn_offset_commit("commit without group metadata", txn, pid, epoch, group, topic, 8)
    run.txn_offset_commit(
        "commit in a later generation",
        txn,
        pid,
        epoch,
        group,
        topic,
        9,
        generation_id=generation2 + 1,
        member_id=member,
    )
    run.end_txn("commit", txn, pid, epoch, True)
    run.await_transaction(txn)
    run.offset_fetch("committed offset", group, topic, require_stable=True)
    run.describe_group("still stable", group)


def read_committed_across_open_and_aborted(run: Run) -> None:
    """read_committed and read_uncommitted fetches while one transaction is open and another
    was aborted, then after the open one commits."""
    topic = run.create_topic("rc")
    t1, t2 = run.name("txn1"), run.name("txn2")
    p1, e1 = run.init_producer_id("init 1", t1)
    p2, e2 = run.init_producer_id("init 2", t2)
    run.add_partitions("add 1", t1, p1, e1, topic)
    run.produce(
        "open transaction",
        topic,
        [b"o1", b"o2"],
        producer_id=p1,
        producer_epoch=e1,
        base_sequence=0,
        transactional_id=t1,
    )
    run.produce("plain", topic, [b"plain"])
    run.add_partitions("add 2", t2, p2, e2, topic)
    run.produce(
        "aborted transaction",
        topic,
        [b"x1"],
        producer_id=p2,
        producer_epoch=e2,
        base_sequence=0,
        transactional_id=t2,
    )
    run.end_txn("abort 2", t2, p2, e2, False)
    run.await_transaction(t2)
    run.fetch("read_committed while open", topic, 0, READ_COMMITTED)
    run.fetch("read_uncommitted while open", topic, 0, READ_UNCOMMITTED)
    run.describe_producers("producers while open", topic)
    run.end_txn("commit 1", t1, p1, e1, True)
    run.await_transaction(t1)
    run.fetch("read_committed after the commit", topic, 0, READ_COMMITTED)
    run.fetch("read_committed from the aborted batch", topic, 3, READ_COMMITTED)
    run.fetch("read_committed past the abort marker", topic, 5, READ_COMMITTED)
    run.fetch("read_committed at the end", topic, 6, READ_COMMITTED)
    run.fetch("read_committed past the end", topic, 7, READ_COMMITTED)
    run.describe_producers("producers after", topic)


def list_offsets_with_isolation_levels(run: Run) -> None:
    """ListOffsets earliest, latest, max timestamp and by timestamp, read_uncommitted and
    read_committed, with a transaction open and after it commits."""
    topic = run.create_topic("lo")
    txn = run.name("txn")
    run.produce("plain", topic, [b"a", b"b"], timestamps=[0, 10])
    pid, epoch = run.init_producer_id("init", txn)
    run.add_partitions("add", txn, pid, epoch, topic)
    run.produce(
        "transactional",
        topic,
        [b"c"],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=0,
        transactional_id=txn,
        timestamps=[20],
    )

    def lookups(when: str) -> None:
        for isolation, name in (
            (READ_UNCOMMITTED, "read_uncommitted"),
            (READ_COMMITTED, "read_committed"),
        ):
            for ts, what in (
                (EARLIEST, "earliest"),
                (LATEST, "latest"),
                (MAX_TIMESTAMP, "max timestamp"),
                (5, "timestamp 5"),
                (15, "timestamp 15"),
                (100, "timestamp 100"),
            ):
                stamp = ts if ts < 0 else run.at(ts)
                run.list_offsets(f"{what} {name} {when}", topic, isolation, stamp)

    lookups("while open")
    run.end_txn("commit", txn, pid, epoch, True)
    run.await_transaction(txn)
    lookups("after the commit")


def offset_fetch_with_pending_transactional_commit(run: Run) -> None:
    """OffsetFetch with and without require_stable while a TxnOffsetCommit is pending, after
    the commit, and while a second one is pending then aborted."""
    topic = run.create_topic("of")
    group = run.name("group")
    txn = run.name("txn")
    pid, epoch = run.init_producer_id("init", txn)
    run.add_offsets("add offsets", txn, pid, epoch, group)
    run.txn_offset_commit("pending commit", txn, pid, epoch, group, topic, 5)
    run.offset_fetch("require_stable while pending", group, topic, True)
    run.offset_fetch("not require_stable while pending", group, topic, False)
    run.describe_group("group while pending", group)
    run.end_txn("commit", txn, pid, epoch, True)
    run.await_transaction(txn)
    run.offset_fetch("require_stable after commit", group, topic, True)
    run.add_offsets("add offsets again", txn, pid, epoch, group)
    run.txn_offset_commit("second pending commit", txn, pid, epoch, group, topic, 7)
    run.offset_fetch("require_stable while the second is pending", group, topic, True)
    run.offset_fetch("not require_stable while the second is pending", group, topic, False)
    run.end_txn("abort", txn, pid, epoch, False)
    run.await_transaction(txn)
    run.offset_fetch("require_stable after abort", group, topic, True)
    run.describe_group("group after", group)


def delete_records_inside_open_transaction(run: Run) -> None:
    """DeleteRecords to an offset inside a transaction still open, then its abort."""
    topic = run.create_topic("dr")
    txn = run.name("txn")
    run.produce("plain", topic, [b"p1", b"p2"])
    pid, epoch = run.init_producer_id("init", txn)
    run.add_partitions("add", txn, pid, epoch, topic)
    run.produce(
        "open transaction",
        topic,
        [b"t1", b"t2", b"t3"],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=0,
        transactional_id=txn,
    )
    run.delete_records("delete inside the transaction", topic, 3)
    run.delete_records("delete past the high watermark", topic, 9)
    run.list_offsets("earliest", topic, READ_COMMITTED, EARLIEST)
    run.list_offsets("LSO", topic, READ_COMMITTED, LATEST)
    run.describe_producers("producers", topic)
    run.fetch("read_committed from the new start", topic, 3, READ_COMMITTED)
    run.fetch("read_uncommitted before the start", topic, 0, READ_UNCOMMITTED)
    run.end_txn("abort", txn, pid, epoch, False)
    run.await_transaction(txn)
    run.fetch("read_committed after the abort", topic, 3, READ_COMMITTED)
    run.list_offsets("LSO after the abort", topic, READ_COMMITTED, LATEST)


HOUR = 3_600_000
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0",
    "delete.retention.ms": "0",
    "min.compaction.lag.ms": "0",
}


def compaction_of_aborted_data(run: Run) -> None:
    """The cleaner removes an aborted transaction's records (and superseded values) and keeps the
    committed ones."""
    topic = run.create_topic("compact", **COMPACTED)
    t1, t2 = run.name("txn1"), run.name("txn2")
    p1, e1 = run.init_producer_id("init 1", t1)
    run.add_partitions("add 1", t1, p1, e1, topic)
    run.produce(
        "aborted",
        topic,
        [(b"k1", b"aborted1"), (b"k9", b"aborted9")],
        producer_id=p1,
        producer_epoch=e1,
        base_sequence=0,
        transactional_id=t1,
    )
    run.end_txn("abort", t1, p1, e1, False)
    run.await_transaction(t1)
    run.produce("plain", topic, [(b"k1", b"old1"), (b"k2", b"v2")])
    p2, e2 = run.init_producer_id("init 2", t2)
    run.add_partitions("add 2", t2, p2, e2, topic)
    run.produce(
        "committed",
        topic,
        [(b"k1", b"new1"), (b"k3", b"v3")],
        producer_id=p2,
        producer_epoch=e2,
        base_sequence=0,
        transactional_id=t2,
    )
    run.end_txn("commit", t2, p2, e2, True)
    run.await_transaction(t2)
    # No snapshot before cleaning: either broker may clean a rolled segment at any moment.
    # The active segment is never cleaned: a record written segment.ms later rolls it (Kafka
    # compares record timestamps: this one is ten minutes after the markers', which are now).
    rolled_after = time.monotonic() + 0.3
    run.wait_for("segment.ms to pass", lambda: time.monotonic() >= rolled_after)
    run.produce(
        "a record that rolls the segment", topic, [(b"k4", b"v4")], timestamps=[HOUR + 600_000]
    )
    gone = {b"aborted1", b"aborted9", b"old1"}

    def cleaned() -> bool:
        batches = run.fetch_all(topic, READ_UNCOMMITTED)
        return not {v for b in batches for _, v in b.get("records", ())} & gone

    run.wait_for("the cleaner to remove aborted and superseded records", cleaned, 60)
    # Data only: when the cleaner drops markers is a matter of passes, not of the contract.
    data = [b for b in run.fetch_all(topic, READ_UNCOMMITTED) if "control" not in b]
    run.record("records left", data)
    committed = [b for b in run.fetch_all(topic, READ_COMMITTED) if "control" not in b]
    run.record("read_committed after cleaning", committed)


def transactional_requests_out_of_order(run: Run) -> None:
    """The transaction protocol used wrongly: a timeout above transaction.max.timeout.ms,
    records of a partition never added, an unknown topic, an EndTxn with nothing open, a
    TxnOffsetCommit without AddOffsetsToTxn, another producer id, an unknown transactional id."""
    topic = run.create_topic("misuse")
    txn = run.name("txn")
    group = run.name("group")
    run.init_producer_id("a timeout above the maximum", txn, timeout_ms=900_001)
    pid, epoch = run.init_producer_id("init", txn)
    run.describe_transaction("empty", txn)
    run.end_txn("commit with nothing open", txn, pid, epoch, True)
    run.end_txn("abort with nothing open", txn, pid, epoch, False)
    run.produce(
        "records of a partition not added",
        topic,
        [b"a"],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=0,
        transactional_id=txn,
    )
    run.add_partitions("an unknown topic", txn, pid, epoch, run.name("nowhere"))
    run.txn_offset_commit("offsets without AddOffsetsToTxn", txn, pid, epoch, group, topic, 1)
    run.add_partitions("another producer id", txn, pid + 1, epoch, topic)
    run.end_txn("commit of another producer id", txn, pid + 1, epoch, True)
    run.add_partitions("an unknown transactional id", run.name("unknown"), pid, epoch, topic)
    run.describe_transaction("describe an unknown transactional id", run.name("unknown"))
    run.add_partitions("add", txn, pid, epoch, topic)
    run.produce(
        "records without the transactional id",
        topic,
        [b"b"],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=0,
    )
    run.produce(
        "records of the transaction",
        topic,
        [b"c"],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=0,
        transactional_id=txn,
    )
    run.describe_transaction("ongoing", txn)
    run.end_txn("commit", txn, pid, epoch, True)
    run.end_txn("commit again (a retry)", txn, pid, epoch, True)
    run.end_txn("abort after the commit", txn, pid, epoch, False)
    run.await_transaction(txn)
    run.describe_transaction("committed", txn)
    run.fetch("the log", topic, 0, READ_UNCOMMITTED)


def consumer_group_epochs_and_fencing(run: Run) -> None:
    """KIP-848: two members of a consumer group, revocation before assignment, the errors of
    bad epochs, commits fenced by member epoch, a member leaving."""
    topic = run.create_topic("input", partitions=2)
    topic_id = run.topic_id(topic)
    group = run.name("group")
    m1, m2 = str(uuid.uuid4()), str(uuid.uuid4())
    full = {"topics": [topic], "owned": {}, "rebalance_timeout_ms": 30_000}
    epoch1, _ = run.heartbeat("m1 joins", group, m1, 0, **full)
    run.heartbeat("m1 ahead of its epoch", group, m1, epoch1 + 1, owned={})
    run.heartbeat("an unknown member", group, str(uuid.uuid4()), 1, owned={})
    run.heartbeat("a bad epoch", group, m1, -3)
    run.heartbeat("an unknown assignor", group, str(uuid.uuid4()), 0, **full, assignor="nope")
    run.heartbeat("no rebalance timeout", group, str(uuid.uuid4()), 0, topics=[topic], owned={})
    run.offset_commit_v9("commit at the member epoch", group, m1, epoch1, topic, 3)
    run.offset_commit_v9("commit at another epoch", group, m1, epoch1 + 1, topic, 4)
    run.offset_commit_v9("commit of an unknown member", group, "nobody", epoch1, topic, 5)
    epoch2, _ = run.heartbeat("m2 joins", group, m2, 0, **full)
    run.consumer_group_describe("reconciling", group)
    _, kept = run.heartbeat("m1 asked to revoke", group, m1, epoch1, owned={topic_id: [0, 1]})
    run.heartbeat("m1 revoked", group, m1, epoch1, owned={topic_id: kept or []})
    run.heartbeat("m2 gets the released partition", group, m2, epoch2, owned={})
    run.consumer_group_describe("stable", group)
    run.offset_commit_v9("commit at the old epoch", group, m1, epoch1, topic, 6)
    run.heartbeat("m2 leaves", group, m2, -1)
    run.consumer_group_describe("after m2 left", group)
    run.describe_group("described as a classic group", group)


SCENARIOS: dict[str, Scenario] = {
    f.__name__: f
    for f in (
        duplicates_and_out_of_order_sequences,
        fencing_by_epoch_and_new_init,
        transaction_timeout_then_late_requests,
        txn_offset_commit_with_stale_generation,
        read_committed_across_open_and_aborted,
        list_offsets_with_isolation_levels,
        offset_fetch_with_pending_transactional_commit,
        delete_records_inside_open_transaction,
        compaction_of_aborted_data,
        transactional_requests_out_of_order,
        consumer_group_epochs_and_fencing,
    )
}
