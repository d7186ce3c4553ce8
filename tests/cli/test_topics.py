"""`onceflow topics`: create, list, describe, delete against a running broker."""

from __future__ import annotations

from tests.cli.harness import Run, produce_one_per_batch


def test_create_list_describe_delete(run: Run, bootstrap: str, topic: str) -> None:
    created = run("topics", "create", topic, "--partitions", "3", "-b", bootstrap)
    assert created.exit_code == 0, created.stderr
    assert created.stdout.strip() == f"Created topic {topic}."

    assert topic in run("topics", "list", "-b", bootstrap).lines

    described = run("topics", "describe", topic, "-b", bootstrap)
    assert described.exit_code == 0, described.stderr
    header = described.lines[0].split("\t")
    assert header[:3] == [f"Topic: {topic}", "PartitionCount: 3", "ReplicationFactor: 1"]
    rows = described.table_rows()
    assert [row[0] for row in rows] == ["0", "1", "2"]
    for _partition, leader, replicas, isr, earliest, latest, error in rows:
        assert leader == replicas == isr and int(leader) >= 0
        assert (earliest, latest, error) == ("0", "0", "-")

    deleted = run("topics", "delete", topic, "-b", bootstrap)
    assert deleted.exit_code == 0, deleted.stderr
    assert deleted.stdout.strip() == f"Deleted topic {topic}."
    assert topic not in run("topics", "list", "-b", bootstrap).lines


def test_describe_shows_latest_offsets_after_producing(
    run: Run, bootstrap: str, topic: str
) -> None:
    run("topics", "create", topic, "--partitions", "1", "-b", bootstrap)
    produce_one_per_batch(run, bootstrap, topic, "abcd")
    rows = run("topics", "describe", topic, "-b", bootstrap).table_rows()
    assert [(row[0], row[4], row[5]) for row in rows] == [("0", "0", "4")]


def test_describe_without_name_covers_every_topic(run: Run, bootstrap: str, topic: str) -> None:
    run("topics", "create", topic, "--partitions", "2", "-b", bootstrap)
    described = run("topics", "describe", "-b", bootstrap)
    assert described.exit_code == 0, described.stderr
    headers = [line for line in described.lines if line.startswith("Topic: ")]
    assert f"Topic: {topic}\tPartitionCount: 2\tReplicationFactor: 1\tConfigs: " in [
        h[: h.index("Configs: ") + len("Configs: ")] for h in headers
    ]


def test_create_existing_topic_fails_unless_if_not_exists(
    run: Run, bootstrap: str, topic: str
) -> None:
    assert run("topics", "create", topic, "-b", bootstrap).exit_code == 0
    again = run("topics", "create", topic, "-b", bootstrap)
    assert again.exit_code == 1
    assert again.assert_one_error_line() == f"Error: Topic '{topic}' already exists."
    quiet = run("topics", "create", topic, "--if-not-exists", "-b", bootstrap)
    assert (quiet.exit_code, quiet.stdout, quiet.stderr) == (0, "", "")


def test_missing_topic_is_one_clear_line(run: Run, bootstrap: str, topic: str) -> None:
    for args in (("describe", topic), ("delete", topic)):
        outcome = run("topics", *args, "-b", bootstrap)
        assert outcome.exit_code == 1
        assert outcome.assert_one_error_line() == f"Error: Topic '{topic}' does not exist."
    assert run("topics", "delete", topic, "--if-exists", "-b", bootstrap).exit_code == 0


def test_bad_arguments_exit_2_with_one_line(run: Run, bootstrap: str, topic: str) -> None:
    cases = {
        ("topics", "create", topic, "--partitions", "0"): "--partitions must be at least 1",
        ("topics", "create", topic, "--replication-factor", "0"): "--replication-factor",
        ("topics", "create", topic, "--config", "retention.ms"): "expected KEY=VALUE",
        ("topics", "create", topic, "--partitions", "many"): "'--partitions'",
        ("topics", "create"): "Missing argument",
        ("topics", "list", "--bogus"): "No such option: --bogus",
    }
    for args, expected in cases.items():
        outcome = run(*args, "-b", bootstrap)
        assert outcome.exit_code == 2, (args, outcome.stderr)
        assert expected in outcome.assert_one_error_line(), (args, outcome.stderr)
    assert topic not in run("topics", "list", "-b", bootstrap).lines


def test_alter_sets_and_deletes_configs(run: Run, bootstrap: str, topic: str) -> None:
    run("topics", "create", topic, "-b", bootstrap)
    altered = run(
        "topics",
        "alter",
        topic,
        "--add-config",
        "cleanup.policy=[compact,delete]",
        "--add-config",
        "retention.ms=3600000",
        "-b",
        bootstrap,
    )
    assert altered.exit_code == 0, altered.stderr
    assert altered.stdout.strip() == f"Completed updating config for topic {topic}."
    header = run("topics", "describe", topic, "-b", bootstrap).lines[0]
    assert "cleanup.policy=compact,delete" in header and "retention.ms=3600000" in header

    deleted = run("topics", "alter", topic, "--delete-config", "retention.ms", "-b", bootstrap)
    assert deleted.exit_code == 0, deleted.stderr
    header = run("topics", "describe", topic, "-b", bootstrap).lines[0]
    assert "retention.ms=" not in header and "cleanup.policy=compact,delete" in header


def test_alter_errors_are_one_line(run: Run, bootstrap: str, topic: str) -> None:
    run("topics", "create", topic, "-b", bootstrap)
    usage = {
        ("topics", "alter", topic): "Nothing to alter",
        ("topics", "alter", topic, "--add-config", "retention.ms"): "expected KEY=VALUE",
        (
            "topics",
            "alter",
            topic,
            "--add-config",
            "retention.ms=1",
            "--delete-config",
            "retention.ms",
        ): "both added and deleted",
    }
    for args, expected in usage.items():
        outcome = run(*args, "-b", bootstrap)
        assert outcome.exit_code == 2, (args, outcome.stderr)
        assert expected in outcome.assert_one_error_line(), (args, outcome.stderr)

    refused = run("topics", "alter", topic, "--add-config", "cleanup.policy=shred", "-b", bootstrap)
    assert refused.exit_code == 1
    line = refused.assert_one_error_line()
    assert line.startswith(f"Error: Cannot alter configs of topic '{topic}': ")
    assert "shred" in line and "INVALID_CONFIG" in line

    missing = run(
        "topics", "alter", f"{topic}-x", "--add-config", "retention.ms=1", "-b", bootstrap
    )
    assert missing.exit_code == 1
    assert missing.assert_one_error_line() == f"Error: Topic '{topic}-x' does not exist."
