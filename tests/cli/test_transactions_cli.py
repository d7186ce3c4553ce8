"""`onceflow transactions ...` against a broker holding transactions opened by confluent-kafka
transactional producers, and the one-line errors for bad arguments and unreachable brokers."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import typer
from click.testing import Result
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from typer.testing import CliRunner

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.cli.root_group import OnceflowGroup
from onceflow.cli.transactions import transactions_app
from onceflow.protocol.client import KafkaClient
from tests.cli.open_transactions import QUIET, dead_address, last_stable_offset, open_transaction
from tests.confluent import create_topic
from tests.waiting import wait_for


def _app() -> typer.Typer:
    """The root command as main.py builds it, with only the transactions sub-app."""
    app = typer.Typer(cls=OnceflowGroup, add_completion=False, pretty_exceptions_enable=False)

    @app.callback()
    def root() -> None:
        """onceflow"""

    app.add_typer(transactions_app, name="transactions")
    return app


APP = _app()


def run(*args: str, bootstrap: str | None = None) -> Result:
    argv = ["transactions", *args]
    if bootstrap is not None:
        argv += ["--bootstrap-server", bootstrap]
    result = CliRunner().invoke(APP, argv, prog_name="onceflow")
    assert "Traceback" not in result.output + result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def ok(*args: str, bootstrap: str) -> str:
    result = run(*args, bootstrap=bootstrap)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def one_line_error(result: Result, code: int, text: str) -> None:
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert result.stderr.startswith("Error: ")
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert text in result.stderr, result.stderr


def rows(table: str) -> list[list[str]]:
    """The data rows of a printed table (after the header rule), split on whitespace."""
    lines = table.strip().splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"})
    return [line.split() for line in lines[rule + 1 :]]


def read_committed(bootstrap: str, topic: str, partitions: int, count: int) -> list[bytes]:
    """The first `count` values a read_committed consumer reads from the beginning; then checks
    that nothing more is readable below the last stable offset."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "logger": QUIET,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []
    deadline = time.monotonic() + 20
    try:
        while len(values) < count:
            assert time.monotonic() < deadline, f"read only {values}"
            for message in consumer.consume(100, timeout=0.2):
                if message.error() is None:
                    values.append(message.value())
                else:
                    assert message.error().code() == KafkaError._PARTITION_EOF
        extra = consumer.consume(100, timeout=0.5)
        assert [m.value() for m in extra if m.error() is None] == []
    finally:
        consumer.close()
    return values


@pytest.fixture
def txn_id() -> str:
    return f"txn-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def open_txn(
    bootstrap: str, topic_name: str, txn_id: str
) -> Iterator[Callable[[dict[int, list[bytes]]], Producer]]:
    """Opens a transaction on `topic_name` (created with 2 partitions) for the test."""
    create_topic(bootstrap, topic_name, partitions=2)
    producers: list[Producer] = []

    def start(values: dict[int, list[bytes]]) -> Producer:
        producers.append(open_transaction(bootstrap, txn_id, topic_name, values))
        return producers[-1]

    yield start
    for producer in producers:
        # A fenced producer reports its fatal error again on close: expected here.
        with contextlib.suppress(KafkaException):
            producer.close()


def abort_at(topic: str, partition: int, start_offset: int) -> list[str]:
    """The words of `abort` for the transaction that starts at `start_offset`."""
    return [
        "abort",
        "--topic",
        topic,
        "--partition",
        str(partition),
        "--start-offset",
        str(start_offset),
    ]


# --- list, describe, describe-producers ---------------------------------------------------------


def test_list_shows_the_open_transaction_ongoing(
    bootstrap: str, txn_id: str, open_txn: Callable[..., Producer]
) -> None:
    open_txn({0: [b"a"], 1: [b"b"]})
    listed = {r[0]: r for r in rows(ok("list", bootstrap=bootstrap))}
    assert listed[txn_id][3] == "Ongoing"
    producer_id = listed[txn_id][2]

    only_ongoing = rows(ok("list", "--state", "ongoing", bootstrap=bootstrap))
    assert txn_id in [r[0] for r in only_ongoing]
    assert {r[3] for r in only_ongoing} == {"Ongoing"}
    by_producer = rows(ok("list", "--producer-id", producer_id, bootstrap=bootstrap))
    assert [r[0] for r in by_producer] == [txn_id]
    committed_only = rows(ok("list", "--state", "CompleteCommit", bootstrap=bootstrap))
    assert txn_id not in [r[0] for r in committed_only]
    # KIP-994: open for longer than an hour? Not this one.
    long_running = rows(ok("list", "--duration-ms", "3600000", bootstrap=bootstrap))
    assert txn_id not in [r[0] for r in long_running]


def test_describe_shows_state_epoch_timeout_and_partitions(
    bootstrap: str, topic_name: str, txn_id: str, open_txn: Callable[..., Producer]
) -> None:
    open_txn({0: [b"a", b"b"], 1: [b"c"]})
    (row,) = rows(ok("describe", "--transactional-id", txn_id, bootstrap=bootstrap))
    coordinator, listed_id, producer_id, epoch, state, timeout, start, duration, parts, tv = row
    assert (listed_id, epoch, state, timeout) == (txn_id, "0", "Ongoing", "300000")
    assert int(producer_id) >= 0 and int(coordinator) >= 0
    assert abs(int(start) - time.time() * 1000) < 60_000
    assert int(duration) >= 0
    assert parts == f"{topic_name}-0,{topic_name}-1"
    assert tv == "2"  # the coordinator's finalized transaction.version (the default)


def test_describe_producers_shows_the_transaction_start(
    bootstrap: str, topic_name: str, open_txn: Callable[..., Producer]
) -> None:
    open_txn({1: [b"a", b"b", b"c"]})
    (row,) = rows(
        ok("describe-producers", "--topic", topic_name, "--partition", "1", bootstrap=bootstrap)
    )
    producer_id, epoch, coordinator_epoch, last_sequence, last_timestamp, start_offset = row
    assert (epoch, last_sequence, start_offset) == ("0", "2", "0")
    assert int(producer_id) >= 0 and int(coordinator_epoch) >= -1
    assert abs(int(last_timestamp) - time.time() * 1000) < 60_000
    assert (
        rows(
            ok("describe-producers", "--topic", topic_name, "--partition", "0", bootstrap=bootstrap)
        )
        == []
    )


# --- abort by transactional id ------------------------------------------------------------------


def test_abort_by_transactional_id_fences_the_producer_and_unblocks_readers(
    bootstrap: str, topic_name: str, txn_id: str, open_txn: Callable[..., Producer]
) -> None:
    zombie = open_txn({0: [b"aborted-0", b"aborted-1"], 1: [b"aborted-2"]})
    # Committed after the open transaction began: read_committed readers wait behind it.
    other = open_transaction(
        bootstrap, f"{txn_id}-other", topic_name, {0: [b"kept-0"], 1: [b"kept-1"]}
    )
    other.commit_transaction(30)
    other.close()
    with KafkaClient(bootstrap) as client:
        assert last_stable_offset(client, topic_name, 0) == 0

        out = ok("abort", "--transactional-id", txn_id, bootstrap=bootstrap)
        assert f"Aborted the open transaction of '{txn_id}'" in out

        # The abort markers are written: both partitions are stable to their end (p0: two
        # aborted records, one committed, its COMMIT marker, the ABORT marker).
        wait_for(lambda: last_stable_offset(client, topic_name, 0) == 5, what="LSO of p0")
        wait_for(lambda: last_stable_offset(client, topic_name, 1) == 4, what="LSO of p1")
    assert sorted(read_committed(bootstrap, topic_name, 2, 2)) == [b"kept-0", b"kept-1"]
    (row,) = rows(ok("describe", "--transactional-id", txn_id, bootstrap=bootstrap))
    assert row[4] in ("Empty", "CompleteAbort") and int(row[3]) > 0

    # The old instance is fenced: its commit fails for good.
    with pytest.raises(KafkaException) as fenced:
        zombie.commit_transaction(30)
    error = fenced.value.args[0]
    assert error.fatal() or error.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    )

    again = run("abort", "--transactional-id", txn_id, bootstrap=bootstrap)
    one_line_error(again, 1, "has no open transaction")


def test_abort_or_describe_an_unknown_transactional_id(bootstrap: str) -> None:
    for command in ("abort", "describe"):
        result = run(command, "--transactional-id", "no-such-transactional-id", bootstrap=bootstrap)
        one_line_error(result, 1, "Transactional id 'no-such-transactional-id' does not exist.")


# --- hanging transactions -----------------------------------------------------------------------


def test_find_hanging_and_abort_by_start_offset(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path, topic_name: str, txn_id: str
) -> None:
    """A transaction whose coordinator state is lost hangs on its partition; find-hanging
    reports it and abort --start-offset writes the ABORT marker, so the LSO moves again."""
    data_dir = tmp_path / "hanging"
    broker = make_broker(data_dir)
    create_topic(broker.bootstrap, topic_name, partitions=1)
    zombie = open_transaction(broker.bootstrap, txn_id, topic_name, {0: [b"h-0", b"h-1", b"h-2"]})
    assert rows(ok("find-hanging", "--topic", topic_name, bootstrap=broker.bootstrap)) == []

    # Lose the coordinator's memory of the transaction, as a hanging transaction arises.
    broker.kill()
    shutil.rmtree(data_dir / "__transaction_state-0")
    broker.start()
    # Plain, non-idempotent writes after it (the forgetful coordinator would hand out the
    # hanging producer's id again).
    plain = Producer(
        {"bootstrap.servers": broker.bootstrap, "enable.idempotence": False, "logger": QUIET}
    )
    for value in (b"p-0", b"p-1"):
        plain.produce(topic_name, value=value, partition=0)
    assert plain.flush(30) == 0

    with KafkaClient(broker.bootstrap) as client:
        assert last_stable_offset(client, topic_name, 0) == 0
        assert txn_id not in [r[0] for r in rows(ok("list", bootstrap=broker.bootstrap))]
        # Under the default max timeout (15 min) it is too young to be called hanging.
        assert rows(ok("find-hanging", "--topic", topic_name, bootstrap=broker.bootstrap)) == []
        (hanging,) = rows(
            ok(
                "find-hanging",
                "--max-transaction-timeout-ms",
                "0",
                bootstrap=broker.bootstrap,
            )
        )
        topic, partition, producer_id, epoch, _coordinator_epoch, start_offset = hanging[:6]
        assert (topic, partition, epoch, start_offset) == (topic_name, "0", "0", "0")

        wrong = run(*abort_at(topic_name, 0, 1), bootstrap=broker.bootstrap)
        one_line_error(wrong, 1, "Could not find any open transaction starting at offset 1")

        out = ok(*abort_at(topic_name, 0, 0), bootstrap=broker.bootstrap)
        assert f"producer id {producer_id}" in out
        # 3 aborted records, 2 plain ones, 1 marker: everything is stable now.
        assert last_stable_offset(client, topic_name, 0) == 6
    assert sorted(read_committed(broker.bootstrap, topic_name, 1, 2)) == [b"p-0", b"p-1"]
    assert (
        rows(
            ok(
                "find-hanging",
                "--topic",
                topic_name,
                "--max-transaction-timeout-ms",
                "0",
                bootstrap=broker.bootstrap,
            )
        )
        == []
    )
    (producer,) = rows(
        ok(
            "describe-producers",
            "--topic",
            topic_name,
            "--partition",
            "0",
            bootstrap=broker.bootstrap,
        )
    )
    assert producer[0] == producer_id and producer[5] == "None"
    with contextlib.suppress(KafkaException):
        zombie.close()


def test_abort_by_producer_id_and_epochs(
    bootstrap: str, topic_name: str, open_txn: Callable[..., Producer]
) -> None:
    """The form kafka-transactions.sh keeps for brokers older than 3.0."""
    open_txn({0: [b"a"]})
    (row,) = rows(
        ok("describe-producers", "--topic", topic_name, "--partition", "0", bootstrap=bootstrap)
    )
    producer_id, epoch, coordinator_epoch = row[0], row[1], row[2]
    common = ["abort", "--topic", topic_name, "--partition", "0", "--producer-id", producer_id]
    newer = run(
        *common,
        "--producer-epoch",
        str(int(epoch) + 1),
        "--coordinator-epoch",
        coordinator_epoch,
        bootstrap=bootstrap,
    )
    assert newer.exit_code == 0, newer.stderr  # a newer epoch is accepted, as in Kafka
    with KafkaClient(bootstrap) as client:
        assert last_stable_offset(client, topic_name, 0) == 2
    older = run(
        *common,
        "--producer-epoch",
        epoch,
        "--coordinator-epoch",
        coordinator_epoch,
        bootstrap=bootstrap,
    )
    one_line_error(older, 1, "INVALID_PRODUCER_EPOCH")


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["abort"], "Identify the transaction to abort"),
        (["abort", "--transactional-id", "x", "--topic", "t"], "cannot be combined"),
        (["abort", "--topic", "t", "--partition", "0"], "Give --start-offset"),
        (["abort", "--topic", "t"], "Identify the transaction to abort"),
        (
            [
                "abort",
                "--topic",
                "t",
                "--partition",
                "0",
                "--start-offset",
                "1",
                "--producer-id",
                "3",
            ],
            "Give either --start-offset",
        ),
        (["abort", "--topic", "t", "--partition", "0", "--start-offset", "-1"], "--start-offset"),
        (["abort", "--transactional-id", " "], "must not be empty"),
        (["describe"], "Missing option '--transactional-id'"),
        (["describe-producers", "--topic", "t", "--partition", "-1"], "--partition"),
        (["describe-producers", "--partition", "0"], "Missing option '--topic'"),
        (["find-hanging", "--partition", "0"], "--partition needs --topic"),
        (["find-hanging", "--max-transaction-timeout-ms", "-5"], "--max-transaction-timeout-ms"),
        (["list", "--state", "Bogus"], "Unknown --state 'Bogus': expected one of Empty, Ongoing"),
        (["list", "--producer-id", "abc"], "Invalid value for '--producer-id'"),
    ],
)
def test_bad_arguments_are_one_line_usage_errors(args: list[str], text: str) -> None:
    # A dead address: none of these may get as far as connecting.
    one_line_error(run(*args, bootstrap=dead_address()), 2, text)


def test_bad_bootstrap_address_is_a_usage_error() -> None:
    one_line_error(run("list", bootstrap="no-port-here"), 2, "expected HOST:PORT")


@pytest.mark.parametrize(
    "args",
    [
        ["list"],
        ["describe", "--transactional-id", "x"],
        ["abort", "--transactional-id", "x"],
        ["find-hanging"],
    ],
)
def test_unreachable_broker_is_one_line(args: list[str]) -> None:
    address = dead_address()
    started = time.monotonic()
    one_line_error(run(*args, bootstrap=address), 1, f"Cannot reach a broker at {address}")
    assert time.monotonic() - started < 5


def test_as_a_process_errors_are_one_line_without_traceback() -> None:
    """Outside CliRunner too: a real process, real stderr, exit status 1."""
    address = dead_address()
    code = "from tests.cli.test_transactions_cli import APP; APP(prog_name='onceflow')"
    process = subprocess.run(
        [sys.executable, "-c", code, "transactions", "list", "--bootstrap-server", address],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 1
    assert process.stdout == ""
    assert process.stderr == f"Error: Cannot reach a broker at {address}: Connection refused.\n"


def test_missing_topic_or_partition(bootstrap: str, topic_name: str) -> None:
    missing = run(
        "describe-producers", "--topic", topic_name, "--partition", "0", bootstrap=bootstrap
    )
    one_line_error(missing, 1, f"Topic '{topic_name}' does not exist.")
    create_topic(bootstrap, topic_name, partitions=1)
    beyond = run(
        "describe-producers", "--topic", topic_name, "--partition", "3", bootstrap=bootstrap
    )
    one_line_error(beyond, 1, f"Partition 3 of topic '{topic_name}' does not exist.")
    hanging = run("find-hanging", "--topic", f"{topic_name}-nope", bootstrap=bootstrap)
    one_line_error(hanging, 1, "does not exist")
