"""An open transaction to act on, as the protocol client's and the transactions command's
tests need one, and what they read of it: the last stable offset; an address nobody serves."""

from __future__ import annotations

import logging
import socket
from typing import Any

from confluent_kafka import Producer
from kio.schema.errors import ErrorCode

from onceflow.protocol.client import KafkaClient
from onceflow.protocol.entities import build, sibling

LIST_OFFSETS = 2
READ_COMMITTED = 1
LATEST = -1

QUIET = logging.getLogger("tests.cli.librdkafka")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False


def open_transaction(
    bootstrap: str, transactional_id: str, topic: str, values: dict[int, list[bytes]]
) -> Producer:
    """A confluent-kafka transactional producer left with an open transaction holding `values`
    (per partition), every record acknowledged."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            # Long enough that the broker's timeout never aborts it during a test.
            "transaction.timeout.ms": 300_000,
            "logger": QUIET,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for partition, records in values.items():
        for value in records:
            producer.produce(topic, value=value, partition=partition)
    assert producer.flush(30) == 0
    return producer


def last_stable_offset(client: KafkaClient, topic: str, partition: int) -> int:
    """ListOffsets "latest" with read_committed: the partition's last stable offset."""

    def make(cls: type) -> Any:
        topic_cls = sibling(cls, "ListOffsetsTopic")
        part_cls = sibling(cls, "ListOffsetsPartition")
        return build(
            cls,
            replica_id=-1,
            isolation_level=READ_COMMITTED,
            topics=(
                build(
                    topic_cls,
                    name=topic,
                    partitions=(
                        build(
                            part_cls,
                            partition_index=partition,
                            current_leader_epoch=-1,
                            timestamp=LATEST,
                            max_num_offsets=1,
                        ),
                    ),
                ),
            ),
        )

    response = client.call_leader(topic, partition, LIST_OFFSETS, make, min_version=2)
    answer = response.topics[0].partitions[0]
    assert answer.error_code == ErrorCode.none
    return answer.offset


def dead_address() -> str:
    """An address nobody listens on (a port just released by the kernel)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"
