"""`onceflow topics` on many partitions says on stderr what it waits for (the threshold is
lowered here so that a small topic counts as many: 1,000 partitions would load the shared
broker)."""

from __future__ import annotations

import re

import pytest

import onceflow.cli.topics as topics
from tests.cli.harness import Run


def test_create_and_describe_of_many_partitions_show_progress(
    run: Run, bootstrap: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topics, "PROGRESS_PARTITIONS", 4)
    created = run("topics", "create", topic, "--partitions", "4", "-b", bootstrap)
    assert created.exit_code == 0, created.stderr
    assert f"Creating topic {topic} with 4 partitions" in created.stderr
    assert created.stdout.strip() == f"Created topic {topic}."  # stdout as before

    described = run("topics", "describe", topic, "-b", bootstrap)
    assert described.exit_code == 0, described.stderr
    steps = re.findall(rf"\] {topic} \(4 partitions\): (.*)", described.stderr)
    assert steps == ["earliest offsets", "latest offsets", "config overrides, then the table"]
    assert [row[0] for row in described.table_rows()] == ["0", "1", "2", "3"]

    other = run("topics", "create", f"{topic}-b", "--partitions", "1", "-b", bootstrap)
    assert other.exit_code == 0, other.stderr
    everything = run("topics", "describe", "-b", bootstrap)
    assert everything.exit_code == 0, everything.stderr
    done = re.findall(r"described (\d+) of (\d+) topics", everything.stderr)
    assert len(done) >= 2 and done[-1][0] == done[-1][1], everything.stderr


def test_few_partitions_print_nothing_more(run: Run, bootstrap: str, topic: str) -> None:
    created = run("topics", "create", topic, "--partitions", "2", "-b", bootstrap)
    assert (created.exit_code, created.stderr) == (0, "")
    described = run("topics", "describe", topic, "-b", bootstrap)
    assert (described.exit_code, described.stderr) == (0, "")
