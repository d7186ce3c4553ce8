"""Which transactional id owns a producer id (`TransactionCoordinator.owner_of`): what the
produce path checks a transactional producer's batches against, from the durable state only,
through rotation, expiration and a reload."""

from __future__ import annotations

from tests.txn.coordinator_harness import TIMEOUT_MS, Producer, SimulatedBroker

from onceflow.txn.transaction_log import TransactionLogValue, transaction_record
from onceflow.txn.transaction_state import TransactionState


def test_the_owner_follows_the_durable_metadata() -> None:
    broker = SimulatedBroker(config={"transactional_id_expiration_ms": 10_000})
    c = broker.coordinator
    # Idempotent producers have no owner; a transactional one is owned once durable.
    idempotent = broker.write(c.init_producer_id(None, TIMEOUT_MS))
    assert c.owner_of(idempotent.producer_id) is None
    pending = c.init_producer_id("a", TIMEOUT_MS)
    assert c.owner_of(pending.response.producer_id) is None
    broker.write(pending)
    a = pending.response.producer_id
    assert c.owner_of(a) == "a"
    b = broker.new_producer("b")
    assert (c.owner_of(a), c.owner_of(b.producer_id)) == ("a", "b")
    # A new epoch keeps the id; the tombstone of an expired id frees it.
    broker.init(Producer("a"))
    assert c.owner_of(a) == "a"
    broker.clock.advance(10_000)
    for result in c.expire_transactional_ids():
        broker.write(result)
    assert (c.owner_of(a), c.owner_of(b.producer_id)) == (None, None)
    # A reload replays the same answer.
    again = broker.new_producer("a")
    assert broker.restart().owner_of(again.producer_id) == "a"
    assert broker.coordinator.owner_of(a) is None


def test_a_rotated_producer_id_belongs_to_nobody() -> None:
    broker = SimulatedBroker()
    record = transaction_record(
        "t",
        TransactionLogValue(
            producer_id=7000,
            producer_epoch=32766,  # exhausted: the next InitProducerId rotates the id
            txn_timeout_ms=TIMEOUT_MS,
            state=TransactionState.EMPTY,
            partitions=frozenset(),
            txn_last_update_timestamp=broker.clock(),
            txn_start_timestamp=-1,
        ),
    )
    broker.log.append(record)
    broker.coordinator.replay(*record)
    assert broker.coordinator.owner_of(7000) == "t"
    rotated = broker.init(Producer("t"))
    assert rotated.producer_id != 7000
    assert broker.coordinator.owner_of(rotated.producer_id) == "t"
    assert broker.coordinator.owner_of(7000) is None
