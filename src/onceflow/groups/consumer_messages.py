"""Requests and results of ConsumerGroupHeartbeat and ConsumerGroupDescribe as the group
coordinator sees them (the broker's handler translates the wire entities), and the view of the
cluster's topics the coordinator is given."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kio.schema.errors import ErrorCode

Assignment = Mapping[uuid.UUID, frozenset[int]]


class TopicView(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def topic_id(self) -> uuid.UUID: ...

    @property
    def partitions(self) -> Sequence[object]: ...


class TopicsImage(Protocol):
    """The topics the assignment is computed from (the broker's topic registry)."""

    def get(self, name: str) -> TopicView | None: ...

    def by_id(self, topic_id: uuid.UUID) -> TopicView | None: ...

    def __iter__(self) -> Iterator[TopicView]: ...


@dataclass(frozen=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    # None: not sent (unchanged since the last heartbeat)
    owned: Assignment | None = None
    client_id: str = ""
    client_host: str = ""
    api_version: int = 1


@dataclass(frozen=True)
class HeartbeatResult:
    error: ErrorCode
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0  # as Kafka answers an error
    heartbeat_interval_ms: int = 0
    # None: unchanged, not sent
    assignment: Assignment | None = None


@dataclass(frozen=True)
class DescribedPartitions:
    topic_id: uuid.UUID
    topic_name: str
    partitions: tuple[int, ...]


@dataclass(frozen=True)
class DescribedMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    assignment: tuple[DescribedPartitions, ...]
    target_assignment: tuple[DescribedPartitions, ...]
    state: str = ""
    # Kafka's MemberType (ConsumerGroupDescribe v1+): 0 classic protocol, 1 consumer protocol.
    member_type: int = 1


@dataclass(frozen=True)
class ConsumerGroupDescription:
    group_id: str
    error: ErrorCode
    error_message: str | None = None
    state: str = ""
    group_epoch: int = -1
    assignment_epoch: int = -1
    assignor_name: str = ""
    members: tuple[DescribedMember, ...] = ()
