"""`onceflow transactions`: list, describe and abort transactions; find hanging ones.

The commands follow Kafka's kafka-transactions.sh: the same sub-commands, the same table
columns, the same way of finding and aborting a hanging transaction. confluent-kafka's
AdminClient has no calls for ListTransactions, DescribeTransactions, DescribeProducers or
WriteTxnMarkers, so these commands speak the protocol through `onceflow.protocol.client`, which
sends each request where Kafka's admin client would (the coordinator of the transactional id, the
partition leader, every broker): they work against an Apache Kafka cluster too.

Two ways to abort:
- `--transactional-id ID` fences the producer the standard way: a producer with that
  transactional.id calls init_transactions(), so the coordinator bumps the epoch and aborts what
  the previous instance left open.
- `--topic T --partition P --start-offset O` is Kafka's hanging-transaction abort: the producer
  whose open transaction starts at O on that partition (DescribeProducers) gets an ABORT marker
  there (WriteTxnMarkers), for a transaction its coordinator no longer knows about.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

import typer
from confluent_kafka import KafkaException, Producer
from kio.schema.errors import ErrorCode

from onceflow.cli.options import (
    CONNECT_TIMEOUT_S,
    DEFAULT_BOOTSTRAP,
    REQUEST_TIMEOUT_S,
    BootstrapServer,
    BrokerUnreachableError,
    ClientErrors,
    CliError,
    TopicNotFoundError,
    UsageError,
    client_config,
    kafka_error_text,
    note,
    parse_bootstrap,
    result_table,
    stdout_console,
)
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
from onceflow.protocol.entities import build, sibling

# Kafka's transaction.max.timeout.ms default: a transaction older than it cannot be live.
DEFAULT_MAX_TRANSACTION_TIMEOUT_MS = 15 * 60 * 1000
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
# As Kafka's tool: DescribeProducers in batches, so no single request is huge.
PARTITIONS_PER_REQUEST = 500
# Fencing waits while the coordinator writes the abort markers of the previous instance.
FENCE_TIMEOUT_S = 30.0

transactions_app = typer.Typer(
    help="List, describe and abort transactions; find hanging ones (as kafka-transactions.sh).",
    no_args_is_help=True,
    add_completion=False,
)


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

TransactionalId = Annotated[
    str, typer.Option("--transactional-id", help="The producer's transactional.id.")
]


# --- connecting -----------------------------------------------------------------------------


@contextmanager
def cluster(bootstrap: str) -> Iterator[KafkaClient]:
    """A protocol client connected to the cluster; its errors become one-line CliErrors."""
    bootstrap = parse_bootstrap(bootstrap)
    client = KafkaClient(
        bootstrap,
        client_id="onceflow-cli",
        connect_timeout_s=CONNECT_TIMEOUT_S,
        request_timeout_s=REQUEST_TIMEOUT_S,
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
            for state in response.transaction_states:
                if state.error_code in RETRIABLE_ROUTE_ERRORS:
                    moved.append(state.transactional_id)
                else:
                    found[state.transactional_id] = _description(coordinator_id, state)
        if not moved:
            return found
        if time.monotonic() >= deadline:
            raise CliError(f"No coordinator answered for transactional id '{moved[0]}' in time.")
        time.sleep(RETRY_BACKOFF_S)
        pending, refresh = moved, True


def _description(coordinator_id: int, state: Any) -> Description | None:
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


# --- output helpers ---------------------------------------------------------------------------


def _none_if_negative(value: int) -> str:
    return "None" if value < 0 else str(value)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _print_description(d: Description) -> None:
    table = result_table(
        "CoordinatorId",
        "TransactionalId",
        "ProducerId",
        "ProducerEpoch",
        "TransactionState",
        "TransactionTimeoutMs",
        "CurrentTransactionStartTimeMs",
        "TransactionDurationMs",
        "TopicPartitions",
    )
    start = d.start_time_ms
    table.add_row(
        str(d.coordinator_id),
        d.transactional_id,
        str(d.producer_id),
        str(d.producer_epoch),
        d.state,
        str(d.timeout_ms),
        "None" if start is None else str(start),
        "None" if start is None else str(max(0, _now_ms() - start)),
        ",".join(f"{t}-{p}" for t, p in d.partitions),
    )
    stdout_console().print(table)


# --- commands ---------------------------------------------------------------------------------


@transactions_app.command("list")
def list_command(
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            metavar="STATE",
            help=f"Only transactions in this state ({', '.join(TxnState)}); repeatable.",
        ),
    ] = None,
    producer_id: Annotated[
        list[int] | None,
        typer.Option("--producer-id", min=0, help="Only this producer id; repeatable."),
    ] = None,
    duration_ms: Annotated[
        int | None,
        typer.Option(
            "--duration-ms",
            "--duration-filter",
            min=0,
            help="Only transactions running for longer than this (ms).",
        ),
    ] = None,
    bootstrap_server: BootstrapServer = DEFAULT_BOOTSTRAP,
) -> None:
    """List transactional ids, their coordinator, producer id and state."""
    states = [_state_name(s) for s in state or []]
    with cluster(bootstrap_server) as client:
        listings = list_transactions(client, states, producer_id, duration_ms)
    table = result_table("TransactionalId", "Coordinator", "ProducerId", "TransactionState")
    for listing in listings:
        table.add_row(
            listing.transactional_id,
            str(listing.coordinator_id),
            str(listing.producer_id),
            listing.state,
        )
    stdout_console().print(table)


@transactions_app.command("describe")
def describe_command(
    transactional_id: TransactionalId,
    bootstrap_server: BootstrapServer = DEFAULT_BOOTSTRAP,
) -> None:
    """Show a transactional id's state, producer id and epoch, timeout, start and partitions."""
    _require_id(transactional_id)
    with cluster(bootstrap_server) as client:
        description = describe_transaction(client, transactional_id)
    _print_description(description)


@transactions_app.command("describe-producers")
def describe_producers_command(
    topic: Annotated[str, typer.Option("--topic", help="Topic name.")],
    partition: Annotated[int, typer.Option("--partition", min=0, help="Partition number.")],
    bootstrap_server: BootstrapServer = DEFAULT_BOOTSTRAP,
) -> None:
    """Show the active producers of a partition and their open transactions."""
    with cluster(bootstrap_server) as client:
        require_partition(client, topic, partition)
        producers = describe_producers(client, [(topic, partition)])[(topic, partition)]
    table = result_table(
        "ProducerId",
        "ProducerEpoch",
        "LatestCoordinatorEpoch",
        "LastSequence",
        "LastTimestamp",
        "CurrentTransactionStartOffset",
    )
    for p in producers:
        table.add_row(
            str(p.producer_id),
            str(p.producer_epoch),
            str(p.coordinator_epoch),
            str(p.last_sequence),
            str(p.last_timestamp),
            _none_if_negative(p.current_txn_start_offset),
        )
    stdout_console().print(table)


@dataclass(frozen=True)
class OpenTransaction:
    topic: str
    partition: int
    producer: ProducerInfo


def find_hanging(
    client: KafkaClient,
    partitions: list[tuple[str, int]],
    max_transaction_timeout_ms: int,
    now_ms: int,
) -> list[OpenTransaction]:
    """Kafka's search: transactions open on a partition for longer than any transaction may
    live, whose coordinator does not expect to write a marker there (it does not know the
    producer id, or does not list the partition in the transaction it describes)."""
    candidates = [
        OpenTransaction(topic, index, p)
        for (topic, index), producers in sorted(describe_producers(client, partitions).items())
        for p in producers
        if p.current_txn_start_offset >= 0
        and now_ms - p.last_timestamp > max_transaction_timeout_ms
    ]
    if not candidates:
        return []
    producer_ids = sorted({c.producer.producer_id for c in candidates})
    ids_by_producer = {
        listing.producer_id: listing.transactional_id
        for listing in list_transactions(client, producer_ids=producer_ids, strict=True)
        if listing.producer_id in producer_ids
    }
    descriptions = describe_transactions(client, sorted(set(ids_by_producer.values())))
    hanging = []
    for candidate in candidates:
        transactional_id = ids_by_producer.get(candidate.producer.producer_id)
        description = descriptions.get(transactional_id) if transactional_id else None
        if (
            description is None
            or (candidate.topic, candidate.partition) not in description.partitions
        ):
            hanging.append(candidate)
    return hanging


@transactions_app.command("find-hanging")
def find_hanging_command(
    topic: Annotated[
        str | None, typer.Option("--topic", help="Search this topic only (default: all).")
    ] = None,
    partition: Annotated[
        int | None,
        typer.Option("--partition", min=0, help="Search this partition only (needs --topic)."),
    ] = None,
    max_transaction_timeout_ms: Annotated[
        int,
        typer.Option(
            "--max-transaction-timeout-ms",
            min=0,
            help="Transactions open longer than this are candidates (transaction.max.timeout.ms).",
        ),
    ] = DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
    bootstrap_server: BootstrapServer = DEFAULT_BOOTSTRAP,
) -> None:
    """Find open transactions on partitions that no coordinator will ever complete."""
    if partition is not None and topic is None:
        raise UsageError("--partition needs --topic.")
    with cluster(bootstrap_server) as client:
        if topic is not None and partition is not None:
            require_partition(client, topic, partition)
            partitions = [(topic, partition)]
        else:
            topics = [topic] if topic is not None else client.topics(include_internal=True)
            partitions = []
            for name in topics:
                try:
                    partitions.extend((name, p) for p in client.partitions(name))
                except KafkaResponseError as e:
                    if e.error_code == ErrorCode.unknown_topic_or_partition:
                        raise TopicNotFoundError(name) from e
                    raise
        now = _now_ms()
        hanging = find_hanging(client, partitions, max_transaction_timeout_ms, now)
    table = result_table(
        "Topic",
        "Partition",
        "ProducerId",
        "ProducerEpoch",
        "CoordinatorEpoch",
        "StartOffset",
        "LastTimestamp",
        "Duration(min)",
    )
    for h in hanging:
        p = h.producer
        table.add_row(
            h.topic,
            str(h.partition),
            str(p.producer_id),
            str(p.producer_epoch),
            str(p.coordinator_epoch),
            str(p.current_txn_start_offset),
            str(p.last_timestamp),
            str(max(0, now - p.last_timestamp) // 60_000),
        )
    stdout_console().print(table)
    if not hanging:
        note(f"No hanging transactions found in {len(partitions)} partition(s).")


@transactions_app.command("abort")
def abort_command(
    transactional_id: Annotated[
        str | None,
        typer.Option(
            "--transactional-id",
            help="Fence this transactional id and abort its open transaction.",
        ),
    ] = None,
    topic: Annotated[
        str | None, typer.Option("--topic", help="Partition of a hanging transaction: topic.")
    ] = None,
    partition: Annotated[
        int | None, typer.Option("--partition", min=0, help="Partition number.")
    ] = None,
    start_offset: Annotated[
        int | None,
        typer.Option("--start-offset", min=0, help="First offset of the hanging transaction."),
    ] = None,
    producer_id: Annotated[
        int | None, typer.Option("--producer-id", min=0, help="Instead of --start-offset.")
    ] = None,
    producer_epoch: Annotated[
        int | None,
        typer.Option("--producer-epoch", min=0, max=32767, help="With --producer-id."),
    ] = None,
    coordinator_epoch: Annotated[
        int | None, typer.Option("--coordinator-epoch", help="With --producer-id.")
    ] = None,
    bootstrap_server: BootstrapServer = DEFAULT_BOOTSTRAP,
) -> None:
    """Abort a transaction: by transactional id (fencing its producer), or a hanging one on a
    partition (by --start-offset, or by --producer-id/--producer-epoch/--coordinator-epoch)."""
    by_partition = [topic, partition, start_offset, producer_id, producer_epoch, coordinator_epoch]
    if transactional_id is not None:
        if any(value is not None for value in by_partition):
            raise UsageError(
                "--transactional-id cannot be combined with --topic, --partition, "
                "--start-offset or --producer-id/--producer-epoch/--coordinator-epoch."
            )
        _require_id(transactional_id)
        _abort_by_transactional_id(bootstrap_server, transactional_id)
        return
    if topic is None or partition is None:
        raise UsageError(
            "Identify the transaction to abort with --transactional-id, or with --topic, "
            "--partition and --start-offset."
        )
    explicit = [producer_id, producer_epoch, coordinator_epoch]
    if start_offset is not None and any(value is not None for value in explicit):
        raise UsageError(
            "Give either --start-offset or --producer-id/--producer-epoch/--coordinator-epoch."
        )
    if start_offset is None and any(value is None for value in explicit):
        raise UsageError(
            "Give --start-offset, or all of --producer-id, --producer-epoch and "
            "--coordinator-epoch."
        )
    with cluster(bootstrap_server) as client:
        require_partition(client, topic, partition)
        if start_offset is not None:
            found = _producer_at_offset(client, topic, partition, start_offset)
            producer_id, producer_epoch = found.producer_id, found.producer_epoch
            coordinator_epoch = found.coordinator_epoch
        assert producer_id is not None and producer_epoch is not None
        assert coordinator_epoch is not None
        # As Kafka's tool: a producer that never saw a marker reports -1; 0 is at or below any
        # epoch a coordinator can have written with.
        coordinator_epoch = max(0, coordinator_epoch)
        error = write_abort_marker(
            client, topic, partition, producer_id, producer_epoch, coordinator_epoch
        )
    where = f"producer id {producer_id} (epoch {producer_epoch}) on {topic}-{partition}"
    if error != ErrorCode.none:
        raise CliError(f"Failed to abort the transaction of {where}: {_marker_error_text(error)}")
    print(f"Aborted the transaction of {where}.")


def _producer_at_offset(
    client: KafkaClient, topic: str, partition: int, start_offset: int
) -> ProducerInfo:
    producers = describe_producers(client, [(topic, partition)])[(topic, partition)]
    for p in producers:
        if p.current_txn_start_offset == start_offset:
            return p
    raise CliError(
        f"Could not find any open transaction starting at offset {start_offset} "
        f"on partition {topic}-{partition}."
    )


def _marker_error_text(error: ErrorCode) -> str:
    reasons = {
        ErrorCode.invalid_producer_epoch: "a newer epoch of this producer wrote there since",
        ErrorCode.transaction_coordinator_fenced: "a newer coordinator epoch wrote there since",
        ErrorCode.unknown_topic_or_partition: "the partition does not exist",
    }
    reason = reasons.get(error)
    return f"{reason} ({error_name(error)})." if reason else f"{error_name(error)}."


def _abort_by_transactional_id(bootstrap: str, transactional_id: str) -> None:
    with cluster(bootstrap) as client:
        before = describe_transaction(client, transactional_id)
        if before.state in COMPLETING_STATES:
            raise CliError(
                f"The transaction of '{transactional_id}' is already completing "
                f"({before.state}): nothing to abort."
            )
        if before.state not in ABORTABLE_STATES:
            raise CliError(
                f"Transactional id '{transactional_id}' has no open transaction "
                f"(state {before.state}): nothing to abort."
            )
        _fence(client.bootstrap_text, transactional_id, before.timeout_ms)
        after = describe_transaction(client, transactional_id)
    print(
        f"Aborted the open transaction of '{transactional_id}': producer id "
        f"{before.producer_id} epoch {before.producer_epoch} is fenced, the id is now at "
        f"producer id {after.producer_id} epoch {after.producer_epoch} ({after.state})."
    )


def _fence(bootstrap: str, transactional_id: str, timeout_ms: int) -> None:
    """init_transactions() with the id: the coordinator bumps the epoch (fencing the previous
    instance) and aborts its open transaction before it answers."""
    errors = ClientErrors()
    config = client_config(
        bootstrap,
        errors,
        {
            "transactional.id": transactional_id,
            # Keep the id's own timeout: InitProducerId stores the one it is given.
            "transaction.timeout.ms": timeout_ms
            if timeout_ms > 0
            else DEFAULT_TRANSACTION_TIMEOUT_MS,
        },
    )
    producer = Producer(config)
    try:
        producer.init_transactions(FENCE_TIMEOUT_S)
    except KafkaException as e:
        _close(producer)
        raise CliError(
            f"Could not fence transactional id '{transactional_id}': {kafka_error_text(e)}."
        ) from e
    _close(producer)
    errors.raise_if_fatal()


def _close(producer: Producer) -> None:
    try:
        producer.close()
    except KafkaException as e:
        # The producer's own failure, already reported (or about to be); say it, do not mask.
        note(f"Closing the fencing producer: {kafka_error_text(e)}")


def _state_name(text: str) -> str:
    """Kafka's name of a state given in any case."""
    for state in TxnState:
        if state.value.lower() == text.strip().lower():
            return state.value
    raise UsageError(f"Unknown --state '{text}': expected one of {', '.join(TxnState)}.")


def _require_id(transactional_id: str) -> None:
    if not transactional_id.strip():
        raise UsageError("--transactional-id must not be empty.")
