"""What each family of handlers is given: the collaborators it uses, and nothing else.

As Kafka's KafkaApis is constructed with its collaborators (the replica manager, the group and
transaction coordinators, the metadata cache, the config), each family of handlers receives a
small context holding exactly what it calls. None of them sees the `Broker`: the broker builds
the contexts (server.py) and the dispatch table binds each handler to its family's context.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from kio.schema.errors import ErrorCode

from onceflow.broker.config import BrokerConfig
from onceflow.broker.partition import Partition
from onceflow.broker.producer_queue import ProducerQueue
from onceflow.broker.security import BrokerSecurity
from onceflow.broker.topics import TopicRegistry
from onceflow.clock import Clock
from onceflow.coordinator.coordinators import Coordinators
from onceflow.groups.consumer_messages import TopicsImage
from onceflow.groups.coordinator import GroupCoordinator
from onceflow.log.partition_log import PartitionLog
from onceflow.metrics.counters import NO_COUNTERS, BrokerCounters
from onceflow.protocol.messages import Request
from onceflow.txn.coordinator import TransactionCoordinator

# The versions of each implemented API, by key: what ApiVersions advertises.
SupportedVersions = Mapping[int, tuple[int, int]]


@dataclass
class Node:
    """This broker as clients are told of it (Metadata, FindCoordinator). The port is set once
    the listener is bound (a configured port 0 picks a free one)."""

    node_id: int
    host: str
    port: int
    cluster_id: str


class PartitionLookup(Protocol):
    def partition(self, name: str, index: int) -> Partition | None: ...


@dataclass(frozen=True)
class GroupCommit:
    """The group commit as handlers use it: start a round for what they appended (readers are
    woken when it completes), or wait for one, and the error a write answers when its round
    could not make it durable."""

    make_durable: Callable[[list[Partition]], asyncio.Future[None]]
    wait_durable: Callable[[Iterable[PartitionLog]], Awaitable[None]]
    not_durable_code: Callable[[Partition, BaseException], ErrorCode]


# Broker.write_offsets_records: append a group coordinator's records to the offsets log, then
# (once durable) replay them and answer the response given; transactional with a producer id.
OffsetsWriter = Callable[..., Any]


@dataclass(frozen=True)
class AdminContext:
    """Metadata, FindCoordinator, topics and configs."""

    node: Node
    config: BrokerConfig
    topics: TopicRegistry
    # (host, port) of the listener a request came in on: what Metadata and FindCoordinator
    # advertise to that client (advertised.listeners)
    endpoint: Callable[[Request], tuple[str, int]]


# (transactional id, producer id, epoch, partitions) -> the coordinator's error per partition
TransactionAdder = Callable[
    [str, int, int, list[tuple[str, int]]], Awaitable[dict[tuple[str, int], ErrorCode]]
]


@dataclass(frozen=True)
class DataContext:
    """Produce, Fetch, ListOffsets, WriteTxnMarkers, DescribeProducers: the partitions' data."""

    config: BrokerConfig
    topics: TopicRegistry
    transaction_checks: TransactionCoordinator  # KIP-890 verification of transactional produce
    durability: GroupCommit
    clock: Clock
    metrics: BrokerCounters = NO_COUNTERS  # BrokerTopicMetrics, counted by Produce
    # transaction.version 2: add a version 2 producer's partitions to its transaction before
    # its Produce v12 appends (transactions.add_for_leader); None below version 2.
    add_to_transaction: TransactionAdder | None = None
    # a producer's Produce requests that wait for that add, and those behind them
    producers: ProducerQueue = field(default_factory=ProducerQueue)


@dataclass(frozen=True)
class GroupsContext:
    """The classic group protocol and committed offsets."""

    coordinator: GroupCoordinator
    partitions: PartitionLookup
    write_offsets: OffsetsWriter

    @property
    def topics(self) -> TopicsImage:
        """The cluster's topics as the consumer groups' assignors see them: the broker builds
        this context with its TopicRegistry, which is both lookups."""
        return cast(TopicsImage, self.partitions)


@dataclass(frozen=True)
class TxnContext:
    """The transaction APIs of producers and of admin tools; TxnOffsetCommit is the group
    coordinator's offset commit made inside a transaction, hence the groups' context."""

    coordinator: TransactionCoordinator
    driver: Coordinators  # runs the coordinators' results: log, durability, markers
    groups: GroupsContext


@dataclass(frozen=True)
class SecurityContext:
    """SASL and the SCRAM credentials: the listeners' security (onceflow.security)."""

    security: BrokerSecurity


@dataclass(frozen=True)
class HandlerContexts:
    """Every family's context, as the broker builds them; the dispatch table picks one per API."""

    supported: SupportedVersions
    admin: AdminContext
    data: DataContext
    groups: GroupsContext
    txn: TxnContext
    security: SecurityContext
