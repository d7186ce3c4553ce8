"""`onceflow groups`: list, describe (offsets, lag), reset-offsets, delete."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer

from tests.cli.conftest import TANSU, CliBroker
from tests.cli.harness import Outcome, Run, produce_one_per_batch
from tests.waiting import wait_for

# Tansu completes a group join only after about half the session timeout; these keep it short.
FAST_JOIN = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"}
FAST_JOIN_ARGS = [arg for k, v in FAST_JOIN.items() for arg in ("--consumer-property", f"{k}={v}")]


@pytest.fixture
def group() -> str:
    return f"cli-group-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def five_records(run: Run, bootstrap: str, topic: str) -> str:
    """A one-partition topic holding a, b, c, d, e at offsets 0-4."""
    assert run("topics", "create", topic, "--partitions", "1", "-b", bootstrap).exit_code == 0
    produce_one_per_batch(run, bootstrap, topic, "abcde")
    return topic


def offsets_row(run: Run, bootstrap: str, group: str) -> list[str]:
    described = run("groups", "describe", group, "-b", bootstrap)
    assert described.exit_code == 0, described.stderr
    rows = described.table_rows(first_cell=group)
    assert len(rows) == 1, described.stdout
    return rows[0][1:6]  # topic, partition, current offset, log end offset, lag


def consume_partition_0(run: Run, bootstrap: str, topic: str, group: str, count: int) -> Outcome:
    """`onceflow consume` of partition 0 (assigned: no group join) from the group's committed
    offset, `count` records."""
    return run(
        "consume",
        topic,
        "--group",
        group,
        "--partition",
        "0",
        "--max-messages",
        str(count),
        "-b",
        bootstrap,
    )


def test_group_consume_describe_reset_delete(
    run: Run, bootstrap: str, five_records: str, group: str
) -> None:
    topic = five_records
    consumed = run(
        "consume",
        topic,
        "--group",
        group,
        "--from-beginning",
        "--max-messages",
        "3",
        *FAST_JOIN_ARGS,
        "-b",
        bootstrap,
    )
    assert consumed.lines == ["a", "b", "c"], consumed.stderr
    assert group in run("groups", "list", "-b", bootstrap).lines

    described = run("groups", "describe", group, "-b", bootstrap)
    assert f"Consumer group '{group}' has no active members." in described.stderr
    # Only printed records are committed, although the consumer fetched all five.
    assert offsets_row(run, bootstrap, group) == [topic, "0", "3", "5", "2"]

    # Resumes from the committed offset (assigned partition, no group join).
    resumed = consume_partition_0(run, bootstrap, topic, group, 2)
    assert resumed.lines == ["d", "e"], resumed.stderr
    assert offsets_row(run, bootstrap, group) == [topic, "0", "5", "5", "0"]

    dry = run("groups", "reset-offsets", group, "--topic", topic, "--to-earliest", "-b", bootstrap)
    assert dry.exit_code == 0, dry.stderr
    assert dry.table_rows(first_cell=group) == [[group, topic, "0", "0"]]
    assert "Dry run" in dry.stderr
    assert offsets_row(run, bootstrap, group)[2] == "5"  # unchanged

    for args, new_offset in (
        (("--to-offset", "2"), "2"),
        (("--to-offset", "99"), "5"),  # clamped to the log end, as Kafka's tool
        (("--to-earliest",), "0"),
    ):
        reset = run(
            "groups",
            "reset-offsets",
            group,
            "--topic",
            f"{topic}:0",
            *args,
            "--execute",
            "-b",
            bootstrap,
        )
        assert reset.exit_code == 0, reset.stderr
        assert reset.table_rows(first_cell=group) == [[group, topic, "0", new_offset]]
        assert offsets_row(run, bootstrap, group)[2] == new_offset
    again = consume_partition_0(run, bootstrap, topic, group, 5)
    assert again.lines == ["a", "b", "c", "d", "e"]

    deleted = run("groups", "delete", group, "-b", bootstrap)
    assert deleted.exit_code == 0, deleted.stderr
    assert deleted.stdout.strip() == (
        f"Deletion of requested consumer groups ('{group}') was successful."
    )
    assert group not in run("groups", "list", "-b", bootstrap).lines


@pytest.fixture
def active_member(bootstrap: str, five_records: str, group: str) -> Iterator[Consumer]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": "cli-test-member",
            **FAST_JOIN,
        }
    )
    consumer.subscribe([five_records])

    def joined() -> bool:
        consumer.poll(0.1)
        return bool(consumer.assignment())

    wait_for(joined, 30, "the consumer to join its group")
    yield consumer
    consumer.close()


def test_reset_refuses_an_active_group(
    run: Run,
    bootstrap: str,
    five_records: str,
    group: str,
    active_member: Consumer,
    cli_broker: CliBroker,
) -> None:
    refused = run(
        "groups",
        "reset-offsets",
        group,
        "--topic",
        five_records,
        "--to-latest",
        "--execute",
        "-b",
        bootstrap,
    )
    assert refused.exit_code == 1
    assert refused.assert_one_error_line() == (
        f"Error: Assignments can only be reset if the group '{group}' is inactive, "
        "but the current state is Stable."
    )
    if cli_broker.kind == TANSU:
        pytest.skip("Tansu lists no state for groups and describes them without members")
    listed = run("groups", "list", "--state", "-b", bootstrap)
    assert [group, "Stable"] in listed.table_rows(first_cell=group)
    described = run("groups", "describe", group, "-b", bootstrap)
    row = described.table_rows(first_cell=group)[0]
    assert row[1:3] == [five_records, "0"]
    assert row[-1] == "cli-test-member"


def test_describe_unknown_group(
    run: Run, bootstrap: str, group: str, cli_broker: CliBroker
) -> None:
    if cli_broker.kind == TANSU:
        pytest.skip("Tansu describes any group id as an existing empty group")
    outcome = run("groups", "describe", group, "-b", bootstrap)
    assert outcome.exit_code == 1
    assert outcome.assert_one_error_line() == f"Error: Consumer group '{group}' does not exist."


def test_reset_offsets_bad_arguments(run: Run, bootstrap: str, topic: str, group: str) -> None:
    bad = {
        ("--topic", topic): "exactly one of --to-earliest",
        ("--topic", topic, "--to-earliest", "--to-latest"): "exactly one of",
        ("--to-earliest",): "either --topic or --all-topics",
        ("--topic", topic, "--all-topics", "--to-earliest"): "either --topic or --all-topics",
        ("--topic", topic, "--to-earliest", "--execute", "--dry-run"): "contradict",
        ("--topic", f"{topic}:x", "--to-earliest"): "partitions must be numbers",
        ("--topic", topic, "--to-offset", "-3"): "--to-offset must not be negative",
    }
    for args, expected in bad.items():
        outcome = run("groups", "reset-offsets", group, *args, "-b", bootstrap)
        assert outcome.exit_code == 2, (args, outcome.stderr)
        assert expected in outcome.assert_one_error_line(), (args, outcome.stderr)
    missing = run(
        "groups", "reset-offsets", group, "--topic", topic, "--to-earliest", "-b", bootstrap
    )
    assert missing.exit_code == 1
    assert missing.assert_one_error_line() == f"Error: Topic '{topic}' does not exist."


def test_describe_shows_the_consumer_protocol_epochs_and_assignments(
    run: Run, bootstrap: str, five_records: str, group: str, cli_broker: CliBroker
) -> None:
    if cli_broker.kind != "onceflow":
        pytest.skip("KIP-848 consumer groups: onceflow's broker")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "client.id": "cli-848-member",
        }
    )
    try:
        consumer.subscribe([five_records])

        def joined() -> bool:
            consumer.poll(0.1)
            return bool(consumer.assignment())

        wait_for(joined, 30, "the consumer to join its group")
        described = run("groups", "describe", group, "-b", bootstrap)
        assert described.exit_code == 0, described.stderr
        assert (
            f"Group '{group}': protocol consumer, state Stable, group epoch 1, "
            "assignment epoch 1, assignor uniform." in described.lines
        ), described.stdout
        # The members table (the offsets table's rows start with the group id).
        [member] = [
            row for row in described.table_rows() if "cli-848-member" in row and row[0] != group
        ]
        assert member[1] == "1"  # its member epoch
        assert member[-2:] == [f"{five_records}:0", f"{five_records}:0"]  # current, target
    finally:
        consumer.close()
    classic = run("groups", "describe", group, "-b", bootstrap)
    assert f"Group '{group}': protocol consumer, state Empty" in classic.stdout
