"""Values and checks the aiokafka and kafka-python transaction tests share: each drives the
same scenarios through its own client's API; what the broker must then hold is the same.

pytest does not rewrite asserts outside test modules and conftest, so each says what it saw."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from onceflow.broker.embedded import EmbeddedBroker
from tests.admin_requests import describe_transactions, list_offsets
from tests.confluent import TP, create_topics, partitions_of
from tests.eos.checker import PartitionRead, read_back, wait_settled

# Committed, aborted, committed: what test_commit_and_abort_seen_by_both_isolation_levels sends.
BATCHES = [("c1", True), ("a1", False), ("c2", True)]


def values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def over_two_partitions(topic: str, prefix: str, n: int) -> list[tuple[str, int, bytes]]:
    """values(prefix, n) as (topic, partition, value) records, alternating partitions 0 and 1."""
    return [(topic, i % 2, v) for i, v in enumerate(values(prefix, n))]


def own_consumer_conf(bootstrap: str, isolation_level: str) -> dict[str, Any]:
    """The consumer settings both clients take by the same names: manual assignment, no
    commits, short fetch waits."""
    return {
        "bootstrap_servers": bootstrap,
        "isolation_level": isolation_level,
        "enable_auto_commit": False,
        "fetch_max_wait_ms": 50,
    }


def assign_from_start(
    consumer: Any, ends: Mapping[TP, int], tp_type: Callable[..., Any]
) -> list[Any]:
    """Assign the partitions of `ends` (as the client's TopicPartition) and seek them to offset
    0; both clients' consumers have the same assign and seek."""
    tps = [tp_type(t, p) for t, p in ends]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)
    return tps


def check_commit_and_abort(
    topic: str,
    read: Mapping[TP, PartitionRead],
    own_committed: Mapping[TP, list[bytes]],
    own_uncommitted: Mapping[TP, list[bytes]],
) -> None:
    """The BATCHES of 8 values over two partitions, as the broker's reads and the client's own
    consumer (read_committed and read_uncommitted) saw them."""
    for p in range(2):
        per = {prefix: values(prefix, 8)[p::2] for prefix, _ in BATCHES}
        tp = (topic, p)
        committed, written = per["c1"] + per["c2"], per["c1"] + per["a1"] + per["c2"]
        seen = (tp, read[tp], own_committed[tp], own_uncommitted[tp])
        assert read[tp].committed == own_committed[tp] == committed, seen
        assert read[tp].uncommitted == own_uncommitted[tp] == written, seen
        assert read[tp].high_watermark == 12 + len(BATCHES), seen  # a marker per transaction


def check_successor_won(bootstrap: str, topic: str, successor: list[bytes]) -> None:
    """After a zombie was fenced: only the successor's values (over two partitions) are
    committed, and the zombie's late b"late" send never reached the log."""
    tps = partitions_of({topic: 2})
    wait_settled(bootstrap, tps)
    read = read_back(bootstrap, tps)
    for p in range(2):
        assert read[(topic, p)].committed == successor[p::2], (p, read[(topic, p)].committed)
        assert b"late" not in read[(topic, p)].uncommitted, (p, read[(topic, p)].uncommitted)


def check_committed(bootstrap: str, tp: TP, expected: list[bytes]) -> None:
    """Once its transactions settle, `tp` holds exactly `expected` read_committed."""
    wait_settled(bootstrap, [tp])
    committed = read_back(bootstrap, [tp])[tp].committed
    assert committed == expected, (tp, committed)


def hung_transaction_setup(broker: EmbeddedBroker, topic: str, client: str) -> tuple[str, TP, str]:
    """The hung-transaction test's topic of one partition on a broker with a short transaction
    timeout: (bootstrap, that partition, the transactional id of `client`)."""
    create_topics(broker.bootstrap, {topic: 1})
    return broker.bootstrap, (topic, 0), f"{client}-{topic}"


def check_hung_then_aborted(bootstrap: str, tp: TP, txn_id: str) -> None:
    """A hung transaction holds the LSO of `tp` at its first offset (0) until the broker's
    transaction timeout aborts it; it then settles as CompleteAbort."""
    lso = list_offsets(bootstrap, [tp], 1)
    assert lso == {tp: 0}, lso
    wait_settled(bootstrap, [tp], timeout=15)
    state = describe_transactions(bootstrap, [txn_id])[txn_id].transaction_state
    assert state == "CompleteAbort", (txn_id, state)
