"""`onceflow produce` and `onceflow consume`: stdin to a topic and back, as Kafka's tools."""

from __future__ import annotations

import time

import pytest

from tests.cli.harness import Outcome, Run


@pytest.fixture
def one_partition(run: Run, bootstrap: str, topic: str) -> str:
    assert run("topics", "create", topic, "--partitions", "1", "-b", bootstrap).exit_code == 0
    return topic


def consume_first(run: Run, bootstrap: str, topic: str, count: int, *options: str) -> Outcome:
    """`onceflow consume` of the first `count` records of `topic`, with `options`."""
    return run(
        "consume",
        topic,
        "--from-beginning",
        "--max-messages",
        str(count),
        *options,
        "-b",
        bootstrap,
    )


def test_keys_round_trip(run: Run, bootstrap: str, one_partition: str) -> None:
    lines = "k1:v1\nk2:value:with:colons\n:empty-key\nk4:\n"
    produced = run(
        "produce",
        one_partition,
        "--property",
        "parse.key=true",
        "--property",
        "key.separator=:",
        "-b",
        bootstrap,
        input=lines,
    )
    assert (produced.exit_code, produced.stdout) == (0, ""), produced.stderr

    consumed = consume_first(
        run, bootstrap, one_partition, 4, "--print-key", "--key-separator", "="
    )
    assert consumed.exit_code == 0, consumed.stderr
    assert consumed.lines == ["k1=v1", "k2=value:with:colons", "=empty-key", "k4="]
    assert "Processed a total of 4 messages" in consumed.stderr


def test_key_separator_option_and_default_tab_output(
    run: Run, bootstrap: str, one_partition: str
) -> None:
    run("produce", one_partition, "--key-separator", "|", "-b", bootstrap, input="a|1\nb|2\n")
    run("produce", one_partition, "-b", bootstrap, input="no key\n")
    consumed = consume_first(
        run,
        bootstrap,
        one_partition,
        3,
        "--print-key",
        "--property",
        "print.offset=true",
        "--property",
        "print.partition=true",
    )
    assert consumed.lines == [
        "Partition:0\tOffset:0\ta\t1",
        "Partition:0\tOffset:1\tb\t2",
        "Partition:0\tOffset:2\tnull\tno key",
    ]
    stamped = consume_first(
        run, bootstrap, one_partition, 1,
        "--property", "print.timestamp=true", "--property", "print.value=false",
        "--property", "print.key=true",
    )  # fmt: skip
    kind, _, millis = stamped.lines[0].partition(":")
    assert kind == "CreateTime" and millis.endswith("\ta")
    assert abs(int(millis.removesuffix("\ta")) - time.time() * 1000) < 600_000


def test_missing_key_separator_stops_at_that_line(
    run: Run, bootstrap: str, one_partition: str
) -> None:
    produced = run(
        "produce",
        one_partition,
        "--key-separator",
        ":",
        "-b",
        bootstrap,
        input="a:1\nbroken line\nc:3\n",
    )
    assert produced.exit_code == 1
    assert produced.assert_one_error_line() == (
        "Error: No key separator found on line number 2: 'broken line'"
    )
    consumed = run(
        "consume",
        one_partition,
        "--from-beginning",
        "--timeout-ms",
        "1000",
        "--print-key",
        "-b",
        bootstrap,
    )
    assert consumed.lines == ["a\t1"]


def test_consume_stops_after_idle_timeout(run: Run, bootstrap: str, one_partition: str) -> None:
    started = time.monotonic()
    consumed = run(
        "consume", one_partition, "--from-beginning", "--timeout-ms", "500", "-b", bootstrap
    )
    assert consumed.exit_code == 0, consumed.stderr
    assert consumed.stdout == ""
    assert "Processed a total of 0 messages" in consumed.stderr
    assert time.monotonic() - started < 10


def test_consume_without_from_beginning_starts_at_the_end(
    run: Run, bootstrap: str, one_partition: str
) -> None:
    run("produce", one_partition, "-b", bootstrap, input="old\n")
    consumed = run("consume", one_partition, "--timeout-ms", "1000", "-b", bootstrap)
    assert (consumed.exit_code, consumed.stdout) == (0, "")


def test_compression_acks_and_isolation_levels(
    run: Run, bootstrap: str, one_partition: str
) -> None:
    for compression, acks in (("gzip", "all"), ("lz4", "1"), ("zstd", "-1"), ("snappy", "0")):
        produced = run(
            "produce",
            one_partition,
            "--compression",
            compression,
            "--acks",
            acks,
            "-b",
            bootstrap,
            input=f"{compression}-{acks}\n",
        )
        assert produced.exit_code == 0, (compression, produced.stderr)
    for level in ("read_committed", "read_uncommitted"):
        consumed = consume_first(
            run, bootstrap, one_partition, 4, "--isolation-level", level, "--timeout-ms", "10000"
        )
        assert consumed.lines == ["gzip-all", "lz4-1", "zstd--1", "snappy-0"], level


def test_consume_one_partition(run: Run, bootstrap: str, topic: str) -> None:
    run("topics", "create", topic, "--partitions", "2", "-b", bootstrap)
    run(
        "produce",
        topic,
        "--key-separator",
        ":",
        "-b",
        bootstrap,
        input="".join(f"k{i}:v{i}\n" for i in range(20)),
    )
    both = [
        run(
            "consume",
            topic,
            "--partition",
            str(p),
            "--from-beginning",
            "--timeout-ms",
            "1000",
            "-b",
            bootstrap,
        ).lines
        for p in (0, 1)
    ]
    assert sorted(both[0] + both[1]) == sorted(f"v{i}" for i in range(20))
    assert both[0] and both[1]  # 20 keys do not all hash to one partition
    missing = run("consume", topic, "--partition", "7", "-b", bootstrap)
    assert missing.exit_code == 1
    assert (
        missing.assert_one_error_line() == f"Error: Partition 7 of topic '{topic}' does not exist."
    )


def test_missing_topic_and_bad_arguments(run: Run, bootstrap: str, topic: str) -> None:
    for args in (("produce", topic), ("consume", topic, "--timeout-ms", "100")):
        outcome = run(*args, "-b", bootstrap, input="x\n")
        assert outcome.exit_code == 1
        assert outcome.assert_one_error_line() == f"Error: Topic '{topic}' does not exist."
    bad = {
        ("produce", topic, "--acks", "2"): "'--acks'",
        ("produce", topic, "--compression", "brotli"): "'--compression'",
        ("produce", topic, "--property", "parse.key=maybe"): "expected true or false",
        ("produce", topic, "--property", "frobnicate=1"): "Unknown --property frobnicate",
        ("consume", topic, "--isolation-level", "dirty"): "'--isolation-level'",
        ("consume", topic, "--max-messages", "0"): "--max-messages must be at least 1",
        ("consume", topic, "--property", "print.everything=true"): "Unknown --property",
        ("consume", topic, "--consumer-property", "fetch.min.bytes"): "expected KEY=VALUE",
    }
    for args, expected in bad.items():
        outcome = run(*args, "-b", bootstrap, input="")
        assert outcome.exit_code == 2, (args, outcome.stderr)
        assert expected in outcome.assert_one_error_line(), (args, outcome.stderr)
