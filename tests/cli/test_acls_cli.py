"""`onceflow acls add|list|remove`, as kafka-acls: against a broker with Kafka's
StandardAuthorizer, where the tool's own PLAINTEXT connection (User:ANONYMOUS) is a super user
and alice, over SASL, is a user the ACLs it adds decide for."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.broker.embedded import EmbeddedBroker
from tests.cli.harness import Outcome, invoke
from tests.security.brokers import authorizing, broker_with_users

ALICE_PASSWORD = "alice-pw"
TIMEOUT_S = 30.0
ROW = ["RESOURCE TYPE", "NAME", "PATTERN TYPE", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION"]


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    data_dir = tmp_path_factory.mktemp("acls-cli") / "data"
    with broker_with_users(
        data_dir,
        {"alice": (ALICE_PASSWORD, ("SCRAM-SHA-256",))},
        listeners="PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        settings={**authorizing("ANONYMOUS"), "group.initial.rebalance.delay.ms": "0"},
        log_level="WARNING",
    ) as broker:
        yield broker


@pytest.fixture
def b(acl_broker: EmbeddedBroker) -> str:
    """The tool's bootstrap address (PLAINTEXT: a super user)."""
    return acl_broker.bootstrap_for("PLAINTEXT")


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def acls(*args: str, input: str | None = None) -> Outcome:
    return invoke("acls", *args, input=input)


def listed(b: str, *args: str) -> set[tuple[str, ...]]:
    outcome = acls("list", *args, "-b", b)
    assert outcome.exit_code == 0, outcome.stderr
    rows = outcome.table_rows()
    return {tuple(row) for row in rows}


def test_add_is_the_cross_product_of_principals_hosts_and_operations(b: str) -> None:
    topic = name("t")
    added = acls(
        "add", "--topic", topic, "--allow-principal", "User:alice", "--allow-principal",
        "User:bob", "--operation", "Read", "--operation", "describe", "--deny-principal",
        "User:eve", "--deny-host", "10.0.0.1", "--deny-host", "10.0.0.2", "-b", b,
    )  # fmt: skip
    assert added.exit_code == 0, added.stderr
    assert len(added.lines) == 8, added.stdout  # 2x1x2 allowed, 1x2x2 denied
    assert all(line.startswith("Added ACL (principal=") for line in added.lines)
    assert listed(b, "--topic", topic) == {
        ("TOPIC", topic, "LITERAL", who, host, op, permission)
        for who, host, permission in [
            ("User:alice", "*", "ALLOW"),
            ("User:bob", "*", "ALLOW"),
            ("User:eve", "10.0.0.1", "DENY"),
            ("User:eve", "10.0.0.2", "DENY"),
        ]
        for op in ("READ", "DESCRIBE")
    }
    again = acls(
        "add", "--topic", topic, "--allow-principal", "User:alice", "--operation", "Read", "-b", b
    )
    assert again.exit_code == 0, again.stderr
    assert again.lines == [
        f"ACL (principal=User:alice, host=*, operation=READ, permissionType=ALLOW) on "
        f"Topic:LITERAL:{topic} already exists."
    ]


def test_list_filters_by_resource_principal_and_pattern_type(b: str) -> None:
    topic = name("orders")
    prefix = topic[:9]
    group = name("g")
    for args in (
        ["--topic", topic, "--allow-principal", "User:alice", "--operation", "Write"],
        ["--topic", prefix, "--resource-pattern-type", "prefixed", "--allow-principal",
         "User:bob", "--operation", "Read"],
        ["--group", group, "--allow-principal", "User:alice", "--operation", "Read"],
    ):  # fmt: skip
        assert acls("add", *args, "-b", b).exit_code == 0
    literal = ("TOPIC", topic, "LITERAL", "User:alice", "*", "WRITE", "ALLOW")
    prefixed = ("TOPIC", prefix, "PREFIXED", "User:bob", "*", "READ", "ALLOW")
    on_group = ("GROUP", group, "LITERAL", "User:alice", "*", "READ", "ALLOW")
    assert {literal, prefixed, on_group} <= listed(b)  # everything
    assert listed(b, "--topic", topic) == {literal}  # literal by default, as kafka-acls
    assert listed(b, "--topic", topic, "--resource-pattern-type", "match") == {literal, prefixed}
    assert listed(b, "--topic", prefix, "--resource-pattern-type", "any") == {prefixed}
    assert listed(b, "--topic", prefix, "--resource-pattern-type", "prefixed") == {prefixed}
    mine = listed(b, "--topic", topic, "--group", group, "--resource-pattern-type", "match",
                  "--principal", "User:alice")  # fmt: skip
    assert mine == {literal, on_group}
    # '*': every topic, and a pattern MATCH finds for any name.
    everyone = ["--topic", "*", "--deny-principal", "User:eve", "--operation", "Write"]
    assert acls("add", *everyone, "-b", b).exit_code == 0
    wildcard = ("TOPIC", "*", "LITERAL", "User:eve", "*", "WRITE", "DENY")
    assert listed(b, "--topic", topic, "--resource-pattern-type", "match") == {
        literal, prefixed, wildcard,
    }  # fmt: skip
    assert acls("remove", *everyone, "--force", "-b", b).exit_code == 0
    header = acls("list", "--group", group, "-b", b).lines[0].split()
    assert header[:2] == ["RESOURCE", "TYPE"]


def test_remove_needs_a_yes_or_force_and_removes_what_the_filters_name(b: str) -> None:
    topic = name("rm")
    add = ["--topic", topic, "--allow-principal", "User:alice", "--allow-principal", "User:bob",
           "--operation", "Read", "--operation", "Write"]  # fmt: skip
    assert acls("add", *add, "-b", b).exit_code == 0
    one = ["remove", "--topic", topic, "--allow-principal", "User:bob", "--operation", "Write"]
    unanswered = acls(*one, "-b", b)
    assert unanswered.exit_code == 2
    # Asked, and nobody answered: the question, then one error line.
    assert "Traceback" not in unanswered.stderr
    assert unanswered.stderr.splitlines()[-1] == (
        "Error: Removing ACLs needs a yes: answer the question or give --force."
    )
    declined = acls(*one, "-b", b, input="n\n")
    assert declined.exit_code == 0 and "Nothing removed." in declined.stderr
    assert len(listed(b, "--topic", topic)) == 4
    yes = acls(*one, "-b", b, input="y\n")
    assert yes.exit_code == 0, yes.stderr
    assert "Remove them? [y/N]" in yes.stderr  # the question; stdout holds only results
    assert yes.lines == [
        f"Removed ACL (principal=User:bob, host=*, operation=WRITE, permissionType=ALLOW) on "
        f"Topic:LITERAL:{topic}."
    ]
    # The entry must match exactly: the default operation is All, which bob's READ is not.
    nothing = acls("remove", "--topic", topic, "--allow-principal", "User:bob", "--force", "-b", b)
    assert nothing.exit_code == 0 and "No ACL matched." in nothing.stderr
    # No principal: every ACL of the resource; a prefixed filter leaves the literal ones alone.
    prefixed = acls("remove", "--topic", topic, "--resource-pattern-type", "prefixed", "--force",
                    "-b", b)  # fmt: skip
    assert prefixed.exit_code == 0 and len(listed(b, "--topic", topic)) == 3
    everything = acls("remove", "--topic", topic, "--force", "-b", b)
    assert everything.exit_code == 0 and len(everything.lines) == 3, everything.stdout
    assert listed(b, "--topic", topic) == set()


def test_producer_and_consumer_shortcuts(b: str) -> None:
    topic, group, txn = name("pc"), name("g"), name("txn")
    producer = acls("add", "--producer", "--topic", topic, "--transactional-id", txn,
                    "--idempotent", "--allow-principal", "User:p", "-b", b)  # fmt: skip
    assert producer.exit_code == 0, producer.stderr
    consumer = acls("add", "--consumer", "--topic", topic, "--group", group,
                    "--allow-principal", "User:c", "-b", b)  # fmt: skip
    assert consumer.exit_code == 0, consumer.stderr
    granted = {
        (row[0], row[1], row[3], row[5])
        for row in listed(
            b, "--topic", topic, "--group", group, "--transactional-id", txn, "--cluster"
        )
        if row[3] in ("User:p", "User:c")
    }
    assert granted == {
        ("TOPIC", topic, "User:p", "WRITE"),
        ("TOPIC", topic, "User:p", "DESCRIBE"),
        ("TOPIC", topic, "User:p", "CREATE"),
        ("TRANSACTIONAL_ID", txn, "User:p", "WRITE"),
        ("TRANSACTIONAL_ID", txn, "User:p", "DESCRIBE"),
        ("CLUSTER", "kafka-cluster", "User:p", "IDEMPOTENT_WRITE"),
        ("TOPIC", topic, "User:c", "READ"),
        ("TOPIC", topic, "User:c", "DESCRIBE"),
        ("GROUP", group, "User:c", "READ"),
    }
    removed = acls("remove", "--consumer", "--topic", topic, "--group", group,
                   "--allow-principal", "User:c", "--force", "-b", b)  # fmt: skip
    assert removed.exit_code == 0 and len(removed.lines) == 3, removed.stdout
    removed = acls("remove", "--producer", "--idempotent", "--topic", topic, "--transactional-id",
                   txn, "--allow-principal", "User:p", "--force", "-b", b)  # fmt: skip
    assert removed.exit_code == 0 and len(removed.lines) == 6, removed.stdout


def produce_error(broker: EmbeddedBroker, topic: str) -> int | None:
    """The error of one record produced by alice (None if it was written)."""
    errors: list[Any] = []
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap_for("SASL_PLAINTEXT"),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "alice",
            "sasl.password": ALICE_PASSWORD,
            "message.timeout.ms": 10_000,
        }
    )
    producer.produce(topic, b"v", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(TIMEOUT_S)
    assert len(errors) == 1
    return None if errors[0] is None else errors[0].code()


def test_what_the_cli_adds_lets_and_stops_a_client(acl_broker: EmbeddedBroker, b: str) -> None:
    topic = name("effect")
    handle = AdminClient({"bootstrap.servers": b})
    handle.create_topics([NewTopic(topic, 1)])[topic].result(TIMEOUT_S)
    assert produce_error(acl_broker, topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    allow = ["--topic", topic, "--allow-principal", "User:alice", "--operation", "Write"]
    assert acls("add", *allow, "-b", b).exit_code == 0
    assert produce_error(acl_broker, topic) is None
    deny = ["--topic", topic, "--deny-principal", "User:alice", "--operation", "Write"]
    assert acls("add", *deny, "-b", b).exit_code == 0
    assert produce_error(acl_broker, topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert acls("remove", *deny, "--force", "-b", b).exit_code == 0
    assert produce_error(acl_broker, topic) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["add", "--topic", "t", "--allow-principal", "User:a", "--operation", "Reed"],
         "Invalid --operation 'Reed'"),
        (["add", "--topic", "t", "--allow-principal", "alice"], "Invalid principal 'alice'"),
        (["add", "--allow-principal", "User:a"], "at least one resource"),
        (["list", "--principal", "bob"], "Invalid principal 'bob'"),
        (["add", "--topic", "t"], "--allow-principal, --deny-principal"),
        (["add", "--group", "g", "--allow-principal", "User:a", "--operation", "Write"],
         "ResourceType Group only supports operations"),
        (["add", "--topic", "t", "--allow-principal", "User:a", "--resource-pattern-type",
          "match"], "not valid when adding"),
        (["add", "--producer", "--topic", "t", "--allow-principal", "User:a", "--operation",
          "Read"], "--producer and --consumer take no --operation"),
        (["add", "--consumer", "--topic", "t", "--allow-principal", "User:a"],
         "With --consumer you must specify a --topic and a --group"),
        (["add", "--idempotent", "--topic", "t", "--allow-principal", "User:a"],
         "only available with --producer"),
    ],
)  # fmt: skip
def test_bad_arguments_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    # A closed port: the arguments are refused before any connection.
    outcome = acls(*args, "-b", "127.0.0.1:1")
    assert outcome.exit_code == 2
    assert message in outcome.assert_one_error_line()


def test_a_broker_without_authorizer_says_security_disabled(bootstrap: str) -> None:
    for args in (["add", "--topic", "t", "--allow-principal", "User:a"], ["list"]):
        outcome = acls(*args, "-b", bootstrap)
        assert outcome.exit_code == 1, outcome.stdout
        assert "SECURITY_DISABLED" in outcome.assert_one_error_line()


def test_acls_outlive_a_restart_and_cluster_authorization(tmp_path: Path) -> None:
    """No super user, allow.everyone.if.no.acl.found: ANONYMOUS manages the ACLs until an
    ACL on the Cluster exists that does not allow it."""
    broker = EmbeddedBroker(
        tmp_path / "data",
        settings={**authorizing(None), "allow.everyone.if.no.acl.found": "true"},
    )
    broker.start()
    try:
        b = broker.bootstrap
        topic = name("durable")
        allow = ["--topic", topic, "--allow-principal", "User:alice", "--operation", "Read"]
        assert acls("add", *allow, "-b", b).exit_code == 0
        broker.restart()  # kill -9
        assert listed(b) == {("TOPIC", topic, "LITERAL", "User:alice", "*", "READ", "ALLOW")}
        deny = ["--cluster", "--deny-principal", "User:ANONYMOUS", "--operation", "Alter"]
        assert acls("add", *deny, "-b", b).exit_code == 0
        for args in (["add", *allow], ["remove", *allow, "--force"]):
            outcome = acls(*args, "-b", b)
            assert outcome.exit_code == 1, outcome.stdout
            assert "CLUSTER_AUTHORIZATION_FAILED" in outcome.assert_one_error_line()
        # librdkafka drops DescribeAcls' error: an empty listing, and a note why it may be.
        refused = acls("list", "-b", b)
        assert refused.exit_code == 0 and refused.table_rows() == []
        assert "the broker refused to list them" in refused.stderr
    finally:
        broker.stop()
