"""The checker of the exactly-once tests: wait until nothing is open or in doubt, then read
every partition back under read_committed and read_uncommitted."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from tests.admin_requests import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    describe_transactions,
    list_offsets,
    list_transactions,
    open_transaction_starts,
)
from tests.confluent import QUIET, TP
from tests.waiting import wait_for

# Transaction states with a decision still to carry out or a transaction still open.
HANGING_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")


def wait_settled(
    bootstrap: str, tps: Iterable[TP], timeout: float = 30.0, *, every_transaction: bool = False
) -> None:
    """Wait until no transaction is open or in doubt on these partitions (ListTransactions,
    then DescribeTransactions of each id; with `every_transaction`, on any partition: for a
    broker of the test's own), none is open in their producer state (DescribeProducers), and
    every last stable offset has caught up with its high watermark."""
    tps = list(tps)
    state: dict[str, object] = {}

    def settled() -> bool:
        listed = list_transactions(bootstrap)
        described = describe_transactions(bootstrap, [t.transactional_id for t in listed])
        lso = list_offsets(bootstrap, tps, READ_COMMITTED)  # first: see read_back
        hw = list_offsets(bootstrap, tps, READ_UNCOMMITTED)
        state.update(
            hanging={
                i: (d.transaction_state, sorted(d.partitions))
                for i, d in described.items()
                if (d.transaction_state in HANGING_STATES or d.error_code)
                and (every_transaction or d.partitions & set(tps))
            },
            open={tp: s for tp, s in open_transaction_starts(bootstrap, tps).items() if s},
            unstable={tp: (lso[tp], hw[tp]) for tp in tps if lso[tp] != hw[tp]},
        )
        return not any(state.values())

    wait_for(settled, timeout, lambda: f"the partitions to settle: {state}")


@dataclass
class PartitionRead:
    """One partition read from offset 0: values in offset order under each isolation level."""

    committed: list[bytes]  # read_committed, up to the last stable offset
    uncommitted: list[bytes]  # read_uncommitted, up to the high watermark
    high_watermark: int
    last_stable_offset: int


def read_values(
    bootstrap: str, ends: Mapping[TP, int], isolation: str, timeout: float
) -> dict[TP, list[bytes]]:
    """Values of each partition from offset 0 up to its end, with a confluent-kafka consumer;
    done when the consumer's position reaches the end (it also moves past control batches and
    aborted records, which are never delivered)."""
    out: dict[TP, list[bytes]] = {tp: [] for tp in ends}
    pending = {tp for tp, end in ends.items() if end > 0}
    if not pending:
        return out
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"checker-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "fetch.wait.max.ms": 50,
            **QUIET,
        }
    )
    try:
        consumer.assign([TopicPartition(t, p, 0) for t, p in pending])
        deadline = time.monotonic() + timeout
        while pending:
            for msg in consumer.consume(1000, timeout=0.1):
                assert msg.error() is None, msg.error()
                tp = (msg.topic(), msg.partition())
                if msg.offset() < ends[tp]:
                    out[tp].append(msg.value())
            for position in consumer.position([TopicPartition(t, p) for t, p in pending]):
                tp = (position.topic, position.partition)
                if position.offset >= ends[tp]:
                    pending.discard(tp)
            assert time.monotonic() < deadline, f"{isolation}: {sorted(pending)} short of {ends}"
    finally:
        consumer.close()
    return out


def read_back(bootstrap: str, tps: Iterable[TP], timeout: float = 30.0) -> dict[TP, PartitionRead]:
    """Read every partition from 0 with read_uncommitted (to the high watermark) and
    read_committed (to the last stable offset, which is the high watermark once nothing is
    open)."""
    tps = list(tps)
    # The last stable offset first: both only grow and LSO <= HW at any instant, so this
    # order gives a consistent pair while markers are still being written.
    lso = list_offsets(bootstrap, tps, READ_COMMITTED)
    hw = list_offsets(bootstrap, tps, READ_UNCOMMITTED)
    uncommitted = read_values(bootstrap, hw, "read_uncommitted", timeout)
    committed = read_values(bootstrap, lso, "read_committed", timeout)
    return {tp: PartitionRead(committed[tp], uncommitted[tp], hw[tp], lso[tp]) for tp in tps}


def duplicates(values: Iterable[bytes]) -> list[bytes]:
    return sorted(v for v, n in Counter(values).items() if n > 1)
