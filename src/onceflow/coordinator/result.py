"""What a coordinator handler returns: the records to write and the response to send after.

Both coordinators (transactions over ``__transaction_state``, groups over
``__consumer_offsets``) follow Apache Kafka's coordinator-runtime model: a handler validates a
request against the current state and returns a :class:`CoordinatorResult`; the driver appends
the records, waits until they are durable, replays them (state changes only on replay), and only
then sends the response and runs the follow-ups (transaction markers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

# A partition of a topic, as the coordinators name it (Kafka's TopicPartition).
TopicPartition = tuple[str, int]
# A record of a coordinator log: key and value (None value = tombstone).
Record = tuple[bytes, bytes | None]
T = TypeVar("T")


@dataclass(frozen=True)
class MarkerJob:
    """Markers to write: one control batch per partition, then the transaction coordinator's
    ``markers_written``."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: tuple[TopicPartition, ...]
    # The client's transaction version (Kafka's WriteTxnMarkers TransactionVersion): from 2 on
    # the marker's epoch is the bumped one, which the partition requires above its own.
    transaction_version: int = 0


@dataclass(frozen=True)
class CoordinatorResult(Generic[T]):
    """Records to append to the coordinator's log, and the response to send once they are
    durable and replayed."""

    records: list[Record]
    response: T
    # Markers to write after the records are durable and the response is sent.
    markers: MarkerJob | None = None
    # The transactional id whose pending transition the records carry (for abort_pending).
    transactional_id: str | None = None


__all__ = ["CoordinatorResult", "MarkerJob", "Record", "TopicPartition"]
