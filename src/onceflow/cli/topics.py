"""`onceflow topics`: create, list, describe and delete topics, as kafka-topics.sh does, and
alter their configs, as `kafka-configs.sh --alter --entity-type topics` does."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Annotated

import typer
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    OffsetSpec,
    ResourceType,
    TopicMetadata,
)
from rich.table import Table

from onceflow.cli.options import cluster_command, command_group
from onceflow.kafka_errors import kafka_error_code
from onceflow.tools.clients import (
    INTERNAL_TOPICS,
    REQUEST_TIMEOUT_S,
    AdminSession,
    Cluster,
    connect_admin,
    result_of,
)
from onceflow.tools.errors import (
    CliError,
    TopicNotFoundError,
    UsageError,
    kafka_error_text,
)
from onceflow.tools.option_values import parse_pairs, require_at_least
from onceflow.tools.output import result_table, stderr_console, stdout_console

topics_app = command_group("Create, list, describe, alter and delete topics.")
# From this many partitions on, create and describe say on stderr what they are waiting for.
PROGRESS_PARTITIONS = 1000

TopicName = Annotated[str, typer.Argument(metavar="NAME", help="Topic name.")]
ExcludeInternal = Annotated[
    bool, typer.Option("--exclude-internal", help="Leave out internal topics.")
]


@topics_app.command("create")
@cluster_command()
def create_topic(
    cluster: Cluster,
    name: TopicName,
    partitions: Annotated[
        int | None,
        typer.Option("--partitions", help="Partition count (default: the broker's)."),
    ] = None,
    replication_factor: Annotated[
        int | None,
        typer.Option(
            "--replication-factor", help="Replicas per partition (default: the broker's)."
        ),
    ] = None,
    config: Annotated[
        list[str] | None,
        typer.Option("--config", metavar="KEY=VALUE", help="Topic config override; repeatable."),
    ] = None,
    if_not_exists: Annotated[
        bool, typer.Option("--if-not-exists", help="Succeed quietly if the topic exists.")
    ] = False,
) -> None:
    """Create a topic."""
    require_at_least(
        ("--partitions", partitions, 1), ("--replication-factor", replication_factor, 1)
    )
    configs = parse_pairs(config or [], "--config")
    session = connect_admin(cluster)
    # -1 asks the broker for its default (KIP-464), as kafka-topics.sh does when omitted.
    new_topic = NewTopic(
        name,
        num_partitions=partitions if partitions is not None else -1,
        replication_factor=replication_factor if replication_factor is not None else -1,
        config=configs,
    )
    if partitions is not None and partitions >= PROGRESS_PARTITIONS:
        stderr_console().print(
            f"Creating topic {name} with {partitions:,} partitions (each one a log "
            "directory on the broker: this takes a while).",
            markup=False,
        )
    _change_topic(
        session.admin.create_topics,
        new_topic,
        name,
        "create",
        tolerated=KafkaError.TOPIC_ALREADY_EXISTS,
        quiet=if_not_exists,
        tolerated_error=CliError(f"Topic '{name}' already exists."),
    )


@topics_app.command("list")
@cluster_command()
def list_topics(
    cluster: Cluster,
    exclude_internal: ExcludeInternal = False,
) -> None:
    """List topic names, one per line."""
    session = connect_admin(cluster)
    for name in _topic_names(session, exclude_internal):
        print(name)


@topics_app.command("describe")
@cluster_command()
def describe_topics(
    cluster: Cluster,
    name: Annotated[
        str | None, typer.Argument(metavar="[NAME]", help="Topic to describe (default: all).")
    ] = None,
    exclude_internal: ExcludeInternal = False,
) -> None:
    """Partitions, leaders, earliest/latest offsets and config overrides of topics."""
    session = connect_admin(cluster)
    if name is not None:
        session.require_topic(name)
        names = [name]
    else:
        names = _topic_names(session, exclude_internal)
    console = stdout_console()
    total = sum(len(session.metadata.topics[topic].partitions) for topic in names)
    progress = DescribeProgress(len(names), total)
    for topic in names:
        description = describe_topic(session, topic, progress)
        print(description.header(), flush=True)
        console.print(description.table())
        progress.topic_done(len(description.partitions))


@topics_app.command("delete")
@cluster_command()
def delete_topic(
    cluster: Cluster,
    name: TopicName,
    if_exists: Annotated[
        bool, typer.Option("--if-exists", help="Succeed quietly if the topic does not exist.")
    ] = False,
) -> None:
    """Delete a topic."""
    session = connect_admin(cluster)
    if name not in session.metadata.topics:
        if if_exists:
            return
        raise TopicNotFoundError(name)
    _change_topic(
        session.admin.delete_topics,
        name,
        name,
        "delete",
        tolerated=KafkaError.UNKNOWN_TOPIC_OR_PART,
        quiet=if_exists,
        tolerated_error=TopicNotFoundError(name),
    )


@topics_app.command("alter")
@cluster_command()
def alter_topic(
    cluster: Cluster,
    name: TopicName,
    add_config: Annotated[
        list[str] | None,
        typer.Option(
            "--add-config",
            metavar="KEY=VALUE",
            # "\\[" keeps rich from reading the bracket as markup
            help="Set a topic config; repeatable. A list value may be bracketed, as "
            "kafka-configs.sh takes it: cleanup.policy=\\[compact,delete].",
        ),
    ] = None,
    delete_config: Annotated[
        list[str] | None,
        typer.Option(
            "--delete-config",
            metavar="KEY",
            help="Remove a topic config override (back to the broker's default); repeatable.",
        ),
    ] = None,
) -> None:
    """Set or remove topic config overrides (IncrementalAlterConfigs)."""
    pairs = parse_pairs(add_config or [], "--add-config")
    added = {key: _unbracket(value) for key, value in pairs.items()}
    deleted = [key.strip() for key in delete_config or []]
    if not added and not deleted:
        raise UsageError("Nothing to alter: give --add-config KEY=VALUE or --delete-config KEY.")
    if any(not key for key in deleted):
        raise UsageError("Invalid --delete-config '': expected a config name.")
    both = sorted(set(added) & set(deleted))
    if both:
        raise UsageError(f"Config '{both[0]}' is both added and deleted.")
    session = connect_admin(cluster)
    session.require_topic(name)
    entries = [
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
        for key, value in added.items()
    ] + [
        ConfigEntry(key, None, incremental_operation=AlterConfigOpType.DELETE)
        for key in dict.fromkeys(deleted)
    ]
    resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=entries)
    futures = session.admin.incremental_alter_configs([resource], request_timeout=REQUEST_TIMEOUT_S)
    try:
        result_of(futures[resource], f"Altering configs of topic '{name}'")
    except KafkaException as exc:
        if kafka_error_code(exc) == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise TopicNotFoundError(name) from exc
        raise CliError(f"Cannot alter configs of topic '{name}': {kafka_error_text(exc)}.") from exc
    print(f"Completed updating config for topic {name}.")


def _unbracket(value: str) -> str:
    """kafka-configs.sh's list syntax, [a,b], to the comma list Kafka stores."""
    stripped = value.strip()
    if len(stripped) >= 2 and stripped[0] == "[" and stripped[-1] == "]":
        return stripped[1:-1]
    return value


def _change_topic(
    operation: Callable[..., dict[str, Future[None]]],
    request: NewTopic | str,
    name: str,
    verb: str,
    *,
    tolerated: int,
    quiet: bool,
    tolerated_error: CliError,
) -> None:
    """Create or delete (`verb`) one topic and say so. The `tolerated` error code is what
    --if-not-exists / --if-exists make quiet; without them it is `tolerated_error`."""
    futures = operation(
        [request], operation_timeout=REQUEST_TIMEOUT_S, request_timeout=REQUEST_TIMEOUT_S
    )
    doing, done = {"create": ("Creating", "Created"), "delete": ("Deleting", "Deleted")}[verb]
    try:
        result_of(futures[name], f"{doing} topic '{name}'")
    except KafkaException as exc:
        if kafka_error_code(exc) == tolerated:
            if quiet:
                return
            raise tolerated_error from exc
        raise CliError(f"Cannot {verb} topic '{name}': {kafka_error_text(exc)}.") from exc
    print(f"{done} topic {name}.")


def _topic_names(session: AdminSession, exclude_internal: bool) -> list[str]:
    return sorted(
        name
        for name in session.metadata.topics
        if not (exclude_internal and name in INTERNAL_TOPICS)
    )


@dataclass
class PartitionRow:
    partition: int
    leader: int
    replicas: list[int]
    isr: list[int]
    earliest: int | str
    latest: int | str
    error: str


@dataclass
class TopicDescription:
    """What `topics describe` shows for one topic."""

    name: str
    partitions: list[PartitionRow]
    configs: dict[str, str | None]
    configs_error: str | None

    def header(self) -> str:
        replication = len(self.partitions[0].replicas) if self.partitions else 0
        if self.configs_error is not None:
            configs = f"(unavailable: {self.configs_error})"
        else:
            configs = ",".join(f"{k}={v}" for k, v in sorted(self.configs.items()))
        return (
            f"Topic: {self.name}\tPartitionCount: {len(self.partitions)}\t"
            f"ReplicationFactor: {replication}\tConfigs: {configs}"
        )

    def table(self) -> Table:
        table = result_table(
            "Partition", "Leader", "Replicas", "Isr", "Earliest", "Latest", "Error"
        )
        for row in self.partitions:
            table.add_row(
                str(row.partition),
                str(row.leader),
                ",".join(map(str, row.replicas)),
                ",".join(map(str, row.isr)),
                str(row.earliest),
                str(row.latest),
                row.error or "-",
            )
        return table


class DescribeProgress:
    """Where `topics describe` is, on stderr, once it has many partitions to go through
    (PROGRESS_PARTITIONS or more): each step of a big topic and the topics done so far."""

    def __init__(self, topics: int, partitions: int) -> None:
        self.topics, self.partitions = topics, partitions
        self.topics_done = self.partitions_done = 0
        self.on = partitions >= PROGRESS_PARTITIONS
        self.started = time.monotonic()

    def step(self, topic: str, partitions: int, what: str) -> None:
        if self.on and partitions >= PROGRESS_PARTITIONS:
            self._say(f"{topic} ({partitions:,} partitions): {what}")

    def topic_done(self, partitions: int) -> None:
        self.topics_done += 1
        self.partitions_done += partitions
        if self.on and self.topics > 1:
            self._say(
                f"described {self.topics_done} of {self.topics} topics, "
                f"{self.partitions_done:,} of {self.partitions:,} partitions"
            )

    def _say(self, text: str) -> None:
        stderr_console().print(f"[{time.monotonic() - self.started:6.1f}s] {text}", markup=False)


def describe_topic(
    session: AdminSession, name: str, progress: DescribeProgress | None = None
) -> TopicDescription:
    """Gather metadata, offsets and config overrides of one existing topic."""
    metadata: TopicMetadata = session.metadata.topics[name]
    partition_ids = sorted(metadata.partitions)
    say = progress.step if progress is not None else lambda *_: None
    say(name, len(partition_ids), "earliest offsets")
    earliest = partition_offsets(session.admin, name, partition_ids, OffsetSpec.earliest())
    say(name, len(partition_ids), "latest offsets")
    latest = partition_offsets(session.admin, name, partition_ids, OffsetSpec.latest())
    rows = []
    for pid in partition_ids:
        part = metadata.partitions[pid]
        rows.append(
            PartitionRow(
                partition=pid,
                leader=part.leader,
                replicas=list(part.replicas),
                isr=list(part.isrs),
                earliest=earliest[pid],
                latest=latest[pid],
                error=kafka_error_text(part.error) if part.error is not None else "",
            )
        )
    say(name, len(partition_ids), "config overrides, then the table")
    configs, configs_error = _topic_overrides(session.admin, name)
    return TopicDescription(name, rows, configs, configs_error)


def partition_offsets(
    admin: AdminClient, topic: str, partitions: list[int], spec: OffsetSpec
) -> dict[int, int | str]:
    """ListOffsets for the given partitions: the offset, or the error's name where one failed."""
    if not partitions:
        return {}
    request = {TopicPartition(topic, pid): spec for pid in partitions}
    futures = admin.list_offsets(request, request_timeout=REQUEST_TIMEOUT_S)
    found: dict[int, int | str] = {}
    for tp, future in futures.items():
        try:
            found[tp.partition] = result_of(future, f"Listing offsets of {topic}").offset
        except KafkaException as exc:
            found[tp.partition] = kafka_error_text(exc)
    return found


def _topic_overrides(admin: AdminClient, name: str) -> tuple[dict[str, str | None], str | None]:
    resource = ConfigResource(ResourceType.TOPIC, name)
    futures = admin.describe_configs([resource], request_timeout=REQUEST_TIMEOUT_S)
    try:
        entries: dict[str, ConfigEntry] = result_of(futures[resource], f"Describing {name}")
    except KafkaException as exc:
        # Some Kafka-protocol brokers lack DescribeConfigs; the rest of the description stands.
        return {}, kafka_error_text(exc)
    return {
        key: ("(sensitive)" if entry.is_sensitive else entry.value)
        for key, entry in entries.items()
        if not entry.is_default  # as kafka-topics.sh: all but built-in defaults
    }, None
