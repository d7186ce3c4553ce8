"""What `onceflow transactions` asks of a cluster, as Kafka's admin client asks it:
ListTransactions on every broker, DescribeTransactions at each id's coordinator,
DescribeProducers and WriteTxnMarkers at each partition's leader, through
`onceflow.protocol.client` (confluent-kafka's AdminClient has none of these calls). Each
request follows a moved coordinator or leader; errors become one-line CliErrors."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.protocol.api_key import ApiKey
from onceflow.protocol.client import (
    RETRIABLE_ROUTE_ERRORS,
    RETRY_BACKOFF_S,
    BrokerConnectionError,
    KafkaClient,
    KafkaClientError,
    KafkaResponseError,
    error_name,
)
from onceflow.protocol.client_security import ClientSecurity, ClientSecurityError
from onceflow.protocol.entities import build, sibling
from onceflow.tools.clients import (
    CONNECT_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    Cluster,
    parse_bootstrap,
)
from onceflow.tools.errors import BrokerUnreachableError, CliError, TopicNotFoundError, UsageError
from onceflow.tools.output import note

# As Kafka's tool: DescribeProducers in batches, so no single request is huge.
PARTITIONS_PER_REQUEST = 500


class TxnState(StrEnum):
    """The transaction coordinator's states, by Kafka's names."""

    empty = "Empty"
    ongoing = "Ongoing"
    prepare_commit = "PrepareCommit"
    prepare_abort = "PrepareAbort"
    complete_commit = "CompleteCommit"
    complete_abort = "CompleteAbort"
    dead = "Dead"
    prepare_epoch_fence = "PrepareEpochFence"


# States in which a producer's transaction is open and nobody is completing it yet.
ABORTABLE_STATES = frozenset({TxnState.ongoing.value, TxnState.prepare_epoch_fence.value})
COMPLETING_STATES = frozenset({TxnState.prepare_commit.value, TxnState.prepare_abort.value})

# --- connecting -----------------------------------------------------------------------------


@contextmanager
def connected(cluster: Cluster) -> Iterator[KafkaClient]:
    """A protocol client connected to the cluster (with its --command-config security
    settings); its errors become one-line CliErrors."""
    bootstrap = parse_bootstrap(cluster.address)
    try:
        security = ClientSecurity.from_settings(cluster.settings)
    except ClientSecurityError as e:
        raise UsageError(f"--command-config: {e}") from None
    client = KafkaClient(
        bootstrap,
        client_id="onceflow-cli",
        connect_timeout_s=CONNECT_TIMEOUT_S,
        request_timeout_s=REQUEST_TIMEOUT_S,
        security=security,
    )
    try:
        try:
            client.connect()
        except BrokerConnectionError as e:
            raise BrokerUnreachableError(
                f"Cannot reach a broker at {bootstrap}: {e.reason}."
            ) from e
        yield client
    except KafkaClientError as e:
        raise CliError(_sentence(str(e))) from e
    finally:
        client.close()


def _sentence(text: str) -> str:
    text = text.rstrip(".")
    return f"{text[:1].upper()}{text[1:]}."


def require_partition(client: KafkaClient, topic: str, partition: int) -> None:
    try:
        partitions = client.partitions(topic)
    except KafkaResponseError as e:
        if e.error_code == ErrorCode.unknown_topic_or_partition:
            raise TopicNotFoundError(topic) from e
        raise
    if partition not in partitions:
        raise CliError(f"Partition {partition} of topic '{topic}' does not exist.")


# --- the protocol calls -----------------------------------------------------------------------


@dataclass(frozen=True)
class Listing:
    transactional_id: str
    coordinator_id: int
    producer_id: int
    state: str


def list_transactions(
    client: KafkaClient,
    states: list[str] | None = None,
    producer_ids: list[int] | None = None,
    duration_ms: int | None = None,
    *,
    strict: bool = False,
) -> list[Listing]:
    """ListTransactions on every broker (each coordinator lists its own ids), merged. A broker
    that fails is a warning, or with `strict` an error (when a missing answer would mislead)."""

    def make(cls: type) -> Any:
        return build(
            cls,
            state_filters=tuple(states or ()),
            producer_id_filters=tuple(producer_ids or ()),
            duration_filter=-1 if duration_ms is None else duration_ms,
        )

    # The duration filter (KIP-994) needs v1: never send it to a broker that would ignore it.
    answers = client.call_each_broker(
        ApiKey.LIST_TRANSACTIONS, make, min_version=1 if duration_ms is not None else None
    )
    problems = [
        f"broker {node.node_id} ({node.address}) did not answer: {error}"
        for node, error in answers.failures
    ]
    problems += [
        f"broker {node.node_id} did not list its transactions: {error_name(response.error_code)}"
        for node, response in answers.responses
        if response.error_code != ErrorCode.none
    ]
    if strict and problems:
        raise CliError(_sentence(f"Cannot list transactions: {problems[0]}"))
    for problem in problems:
        note(f"Warning: {problem}")
    listings: list[Listing] = []
    for node, response in answers.responses:
        if response.error_code != ErrorCode.none:
            continue
        for unknown in response.unknown_state_filters:
            note(f"Warning: broker {node.node_id} does not know the state '{unknown}'")
        listings.extend(
            Listing(t.transactional_id, node.node_id, t.producer_id, t.transaction_state)
            for t in response.transaction_states
        )
    if not answers.responses:
        raise CliError("No broker answered ListTransactions.")
    return sorted(listings, key=lambda listing: listing.transactional_id)


@dataclass(frozen=True)
class Description:
    coordinator_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    start_time_ms: int | None
    partitions: tuple[tuple[str, int], ...]
    # The coordinator's finalized transaction.version (DescribeTransactions has no field for
    # the transaction's own): 2 means clients that know it use transactions version 2.
    transaction_version: int = 0


def describe_transactions(client: KafkaClient, ids: list[str]) -> dict[str, Description | None]:
    """DescribeTransactions at each id's coordinator (one request per coordinator); None for an
    id the coordinator does not know (TRANSACTIONAL_ID_NOT_FOUND). Ids whose coordinator moved
    are asked again at the new one."""
    found: dict[str, Description | None] = {}
    pending, refresh = list(ids), False
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    while True:
        by_coordinator: dict[int, list[str]] = {}
        for txn_id in pending:
            node = client.find_coordinator(txn_id, refresh=refresh)
            by_coordinator.setdefault(node.node_id, []).append(txn_id)
        moved: list[str] = []
        for coordinator_id, batch in sorted(by_coordinator.items()):
            connection = client.coordinator_connection(batch[0])
            cls = connection.request_class(ApiKey.DESCRIBE_TRANSACTIONS)
            response = connection.send(build(cls, transactional_ids=tuple(batch)))
            level = connection.finalized_features.get("transaction.version", 0)
            for state in response.transaction_states:
                if state.error_code in RETRIABLE_ROUTE_ERRORS:
                    moved.append(state.transactional_id)
                else:
                    found[state.transactional_id] = _description(coordinator_id, state, level)
        if not moved:
            return found
        if time.monotonic() >= deadline:
            raise CliError(f"No coordinator answered for transactional id '{moved[0]}' in time.")
        time.sleep(RETRY_BACKOFF_S)
        pending, refresh = moved, True


def _description(
    coordinator_id: int, state: Any, transaction_version: int = 0
) -> Description | None:
    if state.error_code == ErrorCode.transactional_id_not_found:
        return None
    if state.error_code != ErrorCode.none:
        raise CliError(
            f"Failed to describe transactional id '{state.transactional_id}': "
            f"{error_name(state.error_code)}."
        )
    start = state.transaction_start_time
    if not isinstance(start, int):  # kio's datetime, when it parsed one
        start = int(start.timestamp() * 1000)
    return Description(
        coordinator_id=coordinator_id,
        transactional_id=state.transactional_id,
        producer_id=state.producer_id,
        producer_epoch=state.producer_epoch,
        state=state.transaction_state,
        timeout_ms=int(state.transaction_timeout.total_seconds() * 1000),
        start_time_ms=start if start >= 0 else None,
        partitions=tuple(sorted((t.topic, p) for t in state.topics for p in t.partitions)),
        transaction_version=transaction_version,
    )


def describe_transaction(client: KafkaClient, transactional_id: str) -> Description:
    description = describe_transactions(client, [transactional_id]).get(transactional_id)
    if description is None:
        raise CliError(f"Transactional id '{transactional_id}' does not exist.")
    return description


@dataclass(frozen=True)
class ProducerInfo:
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    last_sequence: int
    last_timestamp: int
    current_txn_start_offset: int


def describe_producers(
    client: KafkaClient, partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], list[ProducerInfo]]:
    """DescribeProducers at each partition's leader, in batches; partitions whose leader moved
    are asked again at the new leader."""
    result: dict[tuple[str, int], list[ProducerInfo]] = {}
    pending = list(partitions)
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    while True:
        moved: list[tuple[str, int]] = []
        for leader, owned in sorted(client.leaders_of(pending).items()):
            connection = client.node_connection(leader)
            for start in range(0, len(owned), PARTITIONS_PER_REQUEST):
                batch = owned[start : start + PARTITIONS_PER_REQUEST]
                request = _describe_producers_request(
                    connection.request_class(ApiKey.DESCRIBE_PRODUCERS), batch
                )
                found, errors = _producers_by_partition(connection.send(request))
                result.update(found)
                moved.extend(tp for tp, e in errors.items() if e in RETRIABLE_ROUTE_ERRORS)
                failed = {tp: e for tp, e in errors.items() if e not in RETRIABLE_ROUTE_ERRORS}
                if failed:
                    (topic, index), error = next(iter(failed.items()))
                    raise CliError(
                        f"Failed to describe producers for partition {topic}-{index}: "
                        f"{error_name(error)}."
                    )
        if not moved:
            return result
        if time.monotonic() >= deadline:
            topic, index = moved[0]
            raise CliError(f"No leader answered for partition {topic}-{index} in time.")
        time.sleep(RETRY_BACKOFF_S)
        for topic in sorted({topic for topic, _ in moved}):
            client.partitions(topic)  # refreshes the leaders
        pending = moved


def _describe_producers_request(cls: type, partitions: list[tuple[str, int]]) -> Any:
    topic_cls = sibling(cls, "TopicRequest")
    by_topic: dict[str, list[int]] = {}
    for topic, index in partitions:
        by_topic.setdefault(topic, []).append(index)
    return build(
        cls,
        topics=tuple(
            build(topic_cls, name=name, partition_indexes=tuple(indexes))
            for name, indexes in by_topic.items()
        ),
    )


def _producers_by_partition(
    response: Any,
) -> tuple[dict[tuple[str, int], list[ProducerInfo]], dict[tuple[str, int], ErrorCode]]:
    """The producers of each partition that answered, and the errors of those that did not."""
    found: dict[tuple[str, int], list[ProducerInfo]] = {}
    errors: dict[tuple[str, int], ErrorCode] = {}
    for topic in response.topics:
        for partition in topic.partitions:
            key = (topic.name, partition.partition_index)
            if partition.error_code != ErrorCode.none:
                errors[key] = partition.error_code
                continue
            found[key] = [
                ProducerInfo(
                    producer_id=p.producer_id,
                    producer_epoch=p.producer_epoch,
                    coordinator_epoch=p.coordinator_epoch,
                    last_sequence=p.last_sequence,
                    last_timestamp=p.last_timestamp,
                    current_txn_start_offset=p.current_txn_start_offset,
                )
                for p in partition.active_producers
            ]
    return found, errors


def write_abort_marker(
    client: KafkaClient,
    topic: str,
    partition: int,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
) -> ErrorCode:
    """WriteTxnMarkers ABORT for one producer on one partition, at its leader."""

    def make(cls: type) -> Any:
        marker_cls = sibling(cls, "WritableTxnMarker")
        topic_cls = sibling(cls, "WritableTxnMarkerTopic")
        return build(
            cls,
            markers=(
                build(
                    marker_cls,
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    transaction_result=False,
                    topics=(build(topic_cls, name=topic, partition_indexes=(partition,)),),
                    coordinator_epoch=coordinator_epoch,
                ),
            ),
        )

    response = client.call_leader(
        topic, partition, ApiKey.WRITE_TXN_MARKERS, make, error_of=_marker_error, min_version=1
    )
    return _marker_error(response)


def _marker_error(response: Any) -> ErrorCode:
    for marker in response.markers:
        for topic in marker.topics:
            for partition in topic.partitions:
                if partition.error_code != ErrorCode.none:
                    return partition.error_code
    return ErrorCode.none
