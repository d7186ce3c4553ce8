"""The exactly-once tests' fixtures. Their helpers: `tests/confluent.py` (topics, transactional
producers), `tests/admin_requests.py` (the requests the clients do not expose) and
`tests/eos/checker.py` (reading every partition back under both isolation levels)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow.broker.embedded import EmbeddedBroker


@pytest.fixture(scope="package")
def timeout_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A broker that looks for timed-out transactions every 200 ms (Kafka: 10 s), shared by
    the tests of the transaction timeout (each with its own topic and transactional.id)."""
    broker = EmbeddedBroker(
        Path(tmp_path_factory.mktemp("timeout-broker")),
        settings={
            "group.initial.rebalance.delay.ms": "0",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
        },
    )
    broker.start()
    yield broker
    broker.stop()
