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
from dataclasses import dataclass, replace
from typing import Annotated

import typer
from confluent_kafka import KafkaException, Producer
from kio.schema.errors import ErrorCode

from onceflow.cli.options import cluster_command, command_group
from onceflow.cli.transaction_admin import (
    ABORTABLE_STATES,
    COMPLETING_STATES,
    Description,
    ProducerInfo,
    TxnState,
    connected,
    describe_producers,
    describe_transaction,
    describe_transactions,
    list_transactions,
    require_partition,
    write_abort_marker,
)
from onceflow.protocol.client import KafkaClient, KafkaResponseError, error_name
from onceflow.tools.clients import ClientErrors, Cluster, client_config
from onceflow.tools.errors import CliError, TopicNotFoundError, UsageError, kafka_error_text
from onceflow.tools.output import note, result_table, stdout_console

# Kafka's transaction.max.timeout.ms default: a transaction older than it cannot be live.
DEFAULT_MAX_TRANSACTION_TIMEOUT_MS = 15 * 60 * 1000
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
# Fencing waits while the coordinator writes the abort markers of the previous instance.
FENCE_TIMEOUT_S = 30.0

transactions_app = command_group(
    "List, describe and abort transactions; find hanging ones (as kafka-transactions.sh)."
)


TransactionalId = Annotated[
    str, typer.Option("--transactional-id", help="The producer's transactional.id.")
]


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
        "TransactionVersion",
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
        str(d.transaction_version),
    )
    stdout_console().print(table)


# --- commands ---------------------------------------------------------------------------------


@transactions_app.command("list")
@cluster_command()
def list_command(
    cluster: Cluster,
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
) -> None:
    """List transactional ids, their coordinator, producer id and state."""
    states = [_state_name(s) for s in state or []]
    with connected(cluster) as client:
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
@cluster_command()
def describe_command(
    cluster: Cluster,
    transactional_id: TransactionalId,
) -> None:
    """Show a transactional id's state, producer id and epoch, timeout, start and partitions,
    and the coordinator's finalized transaction.version (2: transactions version 2)."""
    _require_id(transactional_id)
    with connected(cluster) as client:
        description = describe_transaction(client, transactional_id)
    _print_description(description)


@transactions_app.command("describe-producers")
@cluster_command()
def describe_producers_command(
    cluster: Cluster,
    topic: Annotated[str, typer.Option("--topic", help="Topic name.")],
    partition: Annotated[int, typer.Option("--partition", min=0, help="Partition number.")],
) -> None:
    """Show the active producers of a partition and their open transactions."""
    with connected(cluster) as client:
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
@cluster_command()
def find_hanging_command(
    cluster: Cluster,
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
) -> None:
    """Find open transactions on partitions that no coordinator will ever complete."""
    if partition is not None and topic is None:
        raise UsageError("--partition needs --topic.")
    with connected(cluster) as client:
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
@cluster_command()
def abort_command(
    cluster: Cluster,
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
        _abort_by_transactional_id(cluster, transactional_id)
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
    with connected(cluster) as client:
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


def _abort_by_transactional_id(cluster: Cluster, transactional_id: str) -> None:
    with connected(cluster) as client:
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
        _fence(
            replace(cluster, bootstrap=client.bootstrap_text), transactional_id, before.timeout_ms
        )
        after = describe_transaction(client, transactional_id)
    print(
        f"Aborted the open transaction of '{transactional_id}': producer id "
        f"{before.producer_id} epoch {before.producer_epoch} is fenced, the id is now at "
        f"producer id {after.producer_id} epoch {after.producer_epoch} ({after.state})."
    )


def _fence(cluster: Cluster, transactional_id: str, timeout_ms: int) -> None:
    """init_transactions() with the id: the coordinator bumps the epoch (fencing the previous
    instance) and aborts its open transaction before it answers."""
    errors = ClientErrors()
    config = client_config(
        cluster,
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
