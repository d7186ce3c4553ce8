"""The requests simulated clients send and the answers they get.

Each request names the client transaction it belongs to (`txn`), for the checker's books only:
the simulated broker hands the cores exactly the fields a Kafka request carries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

TopicPartition = tuple[str, int]


@dataclass
class TxnRecord:
    """What a client knows of one of its transactions; the checker judges reads by it."""

    txn_no: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    values: list[int] = field(default_factory=list)  # acknowledged values
    acked_offsets: dict[int, tuple[TopicPartition, int]] = field(default_factory=dict)
    offsets: dict[str, int] = field(default_factory=dict)  # group -> committed input offset
    commit_sent: bool = False  # EndTxn(commit) was sent: the outcome may be commit
    end_sent: bool = False  # EndTxn (either result) was sent
    offsets_pending: bool = False  # TxnOffsetCommit was answered NONE
    outcome: str = "open"  # open | committed | aborted | unknown
    transaction_version: int = 0  # 2: its EndTxn bumps the epoch (KIP-890 part 2)


@dataclass(frozen=True)
class InitProducerId:
    transactional_id: str | None
    timeout_ms: int
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True)
class TxnRequest:
    """A request of a transactional producer: who sends it."""

    transactional_id: str
    producer_id: int
    producer_epoch: int

    @property
    def producer(self) -> tuple[str, int, int]:
        return self.transactional_id, self.producer_id, self.producer_epoch


@dataclass(frozen=True)
class AddPartitions(TxnRequest):
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True)
class AddOffsets(TxnRequest):
    group_id: str


@dataclass(frozen=True)
class TxnOffsetCommit(TxnRequest):
    group_id: str
    offsets: tuple[tuple[TopicPartition, int], ...]
    txn: TxnRecord | None = field(default=None, compare=False, repr=False)
    # 2: TxnOffsetCommit v5 of a transactions version 2 client (adds the offsets partition)
    transaction_version: int = 0


@dataclass(frozen=True)
class EndTxn(TxnRequest):
    commit: bool
    txn: TxnRecord | None = field(default=None, compare=False, repr=False)
    # 2: EndTxn v5 (the epoch is bumped; the answer's value is the producer id and epoch)
    transaction_version: int = 0


@dataclass(frozen=True)
class Produce:
    transactional_id: str | None
    partition: TopicPartition
    records: bytes
    values: tuple[int, ...]
    # 2: Produce v12 of a transactions version 2 client (the leader adds the partition)
    transaction_version: int = 0


@dataclass(frozen=True)
class OffsetFetch:
    group_id: str
    partitions: tuple[TopicPartition, ...]
    require_stable: bool


Request = InitProducerId | AddPartitions | AddOffsets | TxnOffsetCommit | EndTxn | Produce


@dataclass(frozen=True)
class Answer:
    """An error code, and what the API returns besides (producer id and epoch, base offset,
    per-partition errors)."""

    error: ErrorCode
    value: Any = None


def describe(request: object) -> str:
    """One short line for traces."""
    if isinstance(request, Produce):
        return (
            f"Produce({request.transactional_id}, {request.partition[0]}-{request.partition[1]}, "
            f"values={list(request.values)})"
        )
    return repr(request).replace("TxnRecord", "txn")
