"""`onceflow run copy|wordcount --sink-url URL --table NAME`: the options, parsed (no Spark)."""

from __future__ import annotations

import pytest

from onceflow.pipelines import copy_topic, wordcount


def test_copy_takes_a_database_instead_of_an_output_topic() -> None:
    args = copy_topic.parser().parse_args(
        [
            "--bootstrap-server",
            "b:9092",
            "--checkpoint",
            "cp",
            "--input",
            "in",
            "--sink-url",
            "sqlite:///x.db",
        ]
    )
    assert (args.sink_url, args.table, args.output_topic) == ("sqlite:///x.db", "events", None)


def test_copy_needs_an_output_topic_or_a_database(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        copy_topic.main(["--bootstrap-server", "b:9092", "--checkpoint", "cp", "--input", "in"])
    assert "one of --output and --sink-url is required" in capsys.readouterr().err


def test_wordcount_table_defaults_to_word_counts() -> None:
    args = wordcount.parser().parse_args(
        ["--bootstrap-server", "b:9092", "--checkpoint", "cp", "--sink-url", "sqlite:///x.db"]
    )
    assert (args.sink_url, args.table) == ("sqlite:///x.db", "word_counts")
