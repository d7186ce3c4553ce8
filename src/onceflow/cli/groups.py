"""`onceflow groups`: list, describe, reset and delete consumer groups.

Behaviour follows kafka-consumer-groups.sh: describe shows per partition the committed
offset, the log end offset, the lag and the owning member; reset-offsets is a dry run unless
--execute is given, and only resets an inactive group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer
from confluent_kafka import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import ConsumerGroupDescription, OffsetSpec

from onceflow.cli.consumer_group_admin import ConsumerGroupInfo, describe_consumer_group
from onceflow.cli.options import cluster_command, command_group
from onceflow.cli.topics import partition_offsets
from onceflow.kafka_errors import kafka_error_code
from onceflow.tools.clients import (
    REQUEST_TIMEOUT_S,
    AdminSession,
    Cluster,
    connect_admin,
    result_of,
)
from onceflow.tools.errors import CliError, UsageError, kafka_error_text
from onceflow.tools.output import note, result_table, stdout_console

groups_app = command_group("List, describe, reset and delete consumer groups.")

GroupId = Annotated[str, typer.Argument(metavar="GROUP", help="Consumer group id.")]


@groups_app.command("list")
@cluster_command()
def list_groups(
    cluster: Cluster,
    state: Annotated[bool, typer.Option("--state", help="Show each group's state too.")] = False,
) -> None:
    """List consumer group ids, one per line."""
    session = connect_admin(cluster)
    result = result_of(
        session.admin.list_consumer_groups(request_timeout=REQUEST_TIMEOUT_S), "Listing groups"
    )
    for error in result.errors:
        note(f"Warning: a broker did not list its groups: {kafka_error_text(error)}")
    listings = sorted(result.valid, key=lambda listing: listing.group_id)
    if not state:
        for listing in listings:
            print(listing.group_id)
        return
    table = result_table("GROUP", "STATE")
    for listing in listings:
        table.add_row(listing.group_id, _state_name(listing.state))
    stdout_console().print(table)


@dataclass
class OffsetRow:
    topic: str
    partition: int
    current: int | None
    log_end: int | str | None
    member: str = "-"
    host: str = "-"
    client: str = "-"

    @property
    def lag(self) -> int | None:
        if self.current is None or not isinstance(self.log_end, int):
            return None
        return max(0, self.log_end - self.current)


@groups_app.command("describe")
@cluster_command()
def describe_group(
    cluster: Cluster,
    group: GroupId,
) -> None:
    """Per partition: committed offset, log end offset, lag and owning member."""
    session = connect_admin(cluster)
    description = _describe(session, group)
    if _state(description) == ConsumerGroupState.DEAD:
        raise CliError(f"Consumer group '{group}' does not exist.")
    committed = committed_offsets(session, group)
    # KIP-848 groups: their epochs and each member's current and target assignment, which
    # ConsumerGroupDescribe gives (confluent-kafka's admin client leaves the epochs out).
    consumer_group = describe_consumer_group(cluster, group)

    rows: dict[tuple[str, int], OffsetRow] = {
        key: OffsetRow(key[0], key[1], offset, None) for key, offset in committed.items()
    }
    for member in description.members:
        for tp in member.assignment.topic_partitions:
            row = rows.setdefault(
                (tp.topic, tp.partition), OffsetRow(tp.topic, tp.partition, None, None)
            )
            row.member, row.host, row.client = member.member_id, member.host, member.client_id
    for topic in sorted({topic for topic, _ in rows}):
        partitions = sorted(p for t, p in rows if t == topic)
        ends = partition_offsets(session.admin, topic, partitions, OffsetSpec.latest())
        for partition in partitions:
            rows[(topic, partition)].log_end = ends[partition]

    if not description.members:
        note(f"Consumer group '{group}' has no active members.")
    table = result_table(
        "GROUP",
        "TOPIC",
        "PARTITION",
        "CURRENT-OFFSET",
        "LOG-END-OFFSET",
        "LAG",
        "CONSUMER-ID",
        "HOST",
        "CLIENT-ID",
    )
    for key in sorted(rows):
        row = rows[key]
        table.add_row(
            group,
            row.topic,
            str(row.partition),
            _dash(row.current),
            _dash(row.log_end),
            _dash(row.lag),
            row.member,
            row.host,
            row.client,
        )
    if consumer_group is None:
        print(f"Group '{group}': protocol classic, state {_state_name(_state(description))}.")
        stdout_console().print(table)
        return
    print(
        f"Group '{group}': protocol consumer, state {consumer_group.state}, "
        f"group epoch {consumer_group.group_epoch}, "
        f"assignment epoch {consumer_group.assignment_epoch}, "
        f"assignor {consumer_group.assignor}."
    )
    stdout_console().print(table)
    _print_consumer_members(consumer_group)


def _print_consumer_members(info: ConsumerGroupInfo) -> None:
    table = result_table(
        "CONSUMER-ID",
        "MEMBER-EPOCH",
        # Kafka's kafka-consumer-groups --members --verbose column: false for a classic member.
        "UPGRADED",
        "INSTANCE-ID",
        "CLIENT-ID",
        "HOST",
        "ASSIGNMENT",
        "TARGET",
    )
    for m in info.members:
        table.add_row(
            m.member_id,
            str(m.member_epoch),
            _dash(None if m.upgraded is None else str(m.upgraded).lower()),
            m.instance_id or "-",
            m.client_id,
            m.client_host,
            _partitions_text(m.assignment),
            _partitions_text(m.target_assignment),
        )
    stdout_console().print(table)


def _partitions_text(assignment: dict[str, list[int]]) -> str:
    """topic:0,1 other:2 (Kafka's tool prints topic:partitions too)."""
    return " ".join(f"{t}:{','.join(map(str, ps))}" for t, ps in sorted(assignment.items())) or "-"


@groups_app.command("reset-offsets")
@cluster_command()
def reset_offsets(
    cluster: Cluster,
    group: GroupId,
    topics: Annotated[
        list[str] | None,
        typer.Option(
            "--topic", metavar="TOPIC[:P,P...]", help="Topic (and partitions) to reset; repeatable."
        ),
    ] = None,
    all_topics: Annotated[
        bool, typer.Option("--all-topics", help="Every topic the group has offsets for.")
    ] = False,
    to_earliest: Annotated[
        bool, typer.Option("--to-earliest", help="Reset to the earliest offset.")
    ] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest", help="Reset to the latest offset.")] = (
        False
    ),
    to_offset: Annotated[
        int | None, typer.Option("--to-offset", help="Reset to this offset (clamped to the log).")
    ] = None,
    execute: Annotated[bool, typer.Option("--execute", help="Apply the reset.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only show the new offsets (the default).")
    ] = False,
) -> None:
    """Show (or, with --execute, commit) new offsets for an inactive group."""
    targets = {"earliest": to_earliest, "latest": to_latest, "offset": to_offset is not None}
    chosen = [name for name, on in targets.items() if on]
    if len(chosen) != 1:
        raise UsageError("Give exactly one of --to-earliest, --to-latest, --to-offset.")
    if to_offset is not None and to_offset < 0:
        raise UsageError(f"--to-offset must not be negative, not {to_offset}.")
    if execute and dry_run:
        raise UsageError("--execute and --dry-run contradict each other.")
    if bool(topics) == all_topics:
        raise UsageError("Give either --topic or --all-topics.")
    requested = [_parse_topic_partitions(item) for item in topics or []]

    session = connect_admin(cluster)
    state = _state(_describe(session, group))
    if state not in (ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD):
        raise CliError(
            f"Assignments can only be reset if the group '{group}' is inactive, "
            f"but the current state is {_state_name(state)}."
        )
    partitions = (
        _resolve_partitions(session, requested)
        if requested
        else sorted(committed_offsets(session, group))
    )
    new_offsets = _new_offsets(session, partitions, chosen[0], to_offset)

    table = result_table("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET")
    for (topic, partition), offset in sorted(new_offsets.items()):
        table.add_row(group, topic, str(partition), str(offset))
    stdout_console().print(table)
    if not execute:
        note("Dry run: nothing was changed. Add --execute to apply these offsets.")
        return
    _commit_offsets(session, group, new_offsets)


@groups_app.command("delete")
@cluster_command()
def delete_group(
    cluster: Cluster,
    group: GroupId,
) -> None:
    """Delete an inactive consumer group and its committed offsets."""
    session = connect_admin(cluster)
    futures = session.admin.delete_consumer_groups([group], request_timeout=REQUEST_TIMEOUT_S)
    try:
        result_of(futures[group], f"Deleting group '{group}'")
    except KafkaException as exc:
        code = kafka_error_code(exc)
        if code == KafkaError.GROUP_ID_NOT_FOUND:
            raise CliError(f"Consumer group '{group}' does not exist.") from exc
        if code == KafkaError.NON_EMPTY_GROUP:
            raise CliError(f"Consumer group '{group}' is not empty: stop its members.") from exc
        raise CliError(f"Cannot delete group '{group}': {kafka_error_text(exc)}.") from exc
    print(f"Deletion of requested consumer groups ('{group}') was successful.")


# --- shared steps -------------------------------------------------------------------------


def committed_offsets(session: AdminSession, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets (OffsetFetch for all partitions)."""
    futures = session.admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=REQUEST_TIMEOUT_S
    )
    result = result_of(futures[group], f"Fetching offsets of group '{group}'")
    offsets: dict[tuple[str, int], int] = {}
    for tp in result.topic_partitions or []:
        if tp.error is not None:
            raise CliError(
                f"Offsets of {tp.topic}-{tp.partition} in group '{group}': "
                f"{kafka_error_text(tp.error)}."
            )
        if tp.offset >= 0:
            offsets[(tp.topic, tp.partition)] = tp.offset
    return offsets


def _describe(session: AdminSession, group: str) -> ConsumerGroupDescription:
    futures = session.admin.describe_consumer_groups([group], request_timeout=REQUEST_TIMEOUT_S)
    try:
        return result_of(futures[group], f"Describing group '{group}'")
    except KafkaException as exc:
        if kafka_error_code(exc) == KafkaError.GROUP_ID_NOT_FOUND:
            raise CliError(f"Consumer group '{group}' does not exist.") from exc
        raise


def _state(description: ConsumerGroupDescription) -> ConsumerGroupState:
    state = description.state
    return state if isinstance(state, ConsumerGroupState) else ConsumerGroupState.UNKNOWN


def _state_name(state: ConsumerGroupState | None) -> str:
    names = {
        ConsumerGroupState.PREPARING_REBALANCING: "PreparingRebalance",
        ConsumerGroupState.COMPLETING_REBALANCING: "CompletingRebalance",
        ConsumerGroupState.STABLE: "Stable",
        ConsumerGroupState.DEAD: "Dead",
        ConsumerGroupState.EMPTY: "Empty",
    }
    return names.get(state, "Unknown") if isinstance(state, ConsumerGroupState) else "Unknown"


def _parse_topic_partitions(item: str) -> tuple[str, list[int] | None]:
    """`topic` or `topic:0,2` (Kafka's --topic syntax)."""
    topic, sep, rest = item.partition(":")
    if not topic:
        raise UsageError(f"Invalid --topic '{item}': expected TOPIC or TOPIC:P,P.")
    if not sep:
        return topic, None
    try:
        return topic, [int(p) for p in rest.split(",")]
    except ValueError as exc:
        raise UsageError(f"Invalid --topic '{item}': partitions must be numbers.") from exc


def _resolve_partitions(
    session: AdminSession, requested: list[tuple[str, list[int] | None]]
) -> list[tuple[str, int]]:
    resolved: list[tuple[str, int]] = []
    for topic, wanted in requested:
        session.require_topic(topic)
        existing = sorted(session.metadata.topics[topic].partitions)
        for partition in wanted if wanted is not None else existing:
            if partition not in existing:
                raise CliError(f"Partition {partition} of topic '{topic}' does not exist.")
            resolved.append((topic, partition))
    return resolved


def _new_offsets(
    session: AdminSession, partitions: list[tuple[str, int]], target: str, to_offset: int | None
) -> dict[tuple[str, int], int]:
    new: dict[tuple[str, int], int] = {}
    for topic in sorted({topic for topic, _ in partitions}):
        ids = [p for t, p in partitions if t == topic]
        earliest = _offsets_or_fail(session, topic, ids, OffsetSpec.earliest())
        latest = _offsets_or_fail(session, topic, ids, OffsetSpec.latest())
        for partition in ids:
            low, high = earliest[partition], latest[partition]
            if target == "earliest":
                new[(topic, partition)] = low
            elif target == "latest":
                new[(topic, partition)] = high
            else:
                assert to_offset is not None
                new[(topic, partition)] = _clamp(to_offset, low, high, f"{topic}-{partition}")
    return new


def _clamp(offset: int, low: int, high: int, where: str) -> int:
    # As Kafka's tool: an offset outside the log is moved to its nearest end, with a warning.
    if offset < low:
        note(f"New offset ({offset}) is lower than earliest offset for {where}. Using {low}.")
        return low
    if offset > high:
        note(f"New offset ({offset}) is higher than latest offset for {where}. Using {high}.")
        return high
    return offset


def _offsets_or_fail(
    session: AdminSession, topic: str, partitions: list[int], spec: OffsetSpec
) -> dict[int, int]:
    found = partition_offsets(session.admin, topic, partitions, spec)
    failed = {p: v for p, v in found.items() if not isinstance(v, int)}
    if failed:
        partition, error = next(iter(failed.items()))
        raise CliError(f"Cannot list offsets of {topic}-{partition}: {error}.")
    return {p: v for p, v in found.items() if isinstance(v, int)}


def _commit_offsets(session: AdminSession, group: str, offsets: dict[tuple[str, int], int]) -> None:
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(t, p, offset) for (t, p), offset in sorted(offsets.items())]
    )
    futures = session.admin.alter_consumer_group_offsets(
        [request], request_timeout=REQUEST_TIMEOUT_S
    )
    result = result_of(futures[group], f"Resetting offsets of group '{group}'")
    for tp in result.topic_partitions or []:
        if tp.error is not None:
            raise CliError(
                f"Offset of {tp.topic}-{tp.partition} was not reset: {kafka_error_text(tp.error)}."
            )


def _dash(value: object) -> str:
    return "-" if value is None else str(value)
