"""Apache Kafka 4.4's kafka-configs (SCRAM users) and kafka-acls against an onceflow broker with
security on: a SASL_PLAINTEXT listener (SCRAM-SHA-256/512), Kafka's StandardAuthorizer and
`super.users=User:admin`; the tools authenticate with --command-config as they would on Kafka,
and what they set is then checked from a client's side (authentication, authorization)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from onceflow.apache_kafka import Distribution
from onceflow.broker.embedded import EmbeddedBroker
from tests.apache_kafka.kafka_tools import ACLS, CONFIGS, TOPICS, KafkaTools, write_log4j2
from tests.confluent import QUIET
from tests.security.brokers import authorizing, broker_with_users

ADMIN = ("admin", "admin-secret")


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    data_dir = tmp_path_factory.mktemp("tools-secure") / "data"
    with broker_with_users(
        data_dir,
        {ADMIN[0]: (ADMIN[1], ("SCRAM-SHA-256",))},
        listeners="SASL_PLAINTEXT://127.0.0.1:0",
        settings={
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
            "group.initial.rebalance.delay.ms": "0",
            **authorizing(ADMIN[0]),
        },
    ) as broker:
        yield broker


@pytest.fixture(scope="module")
def tools(
    apache_kafka: Distribution,
    secure_broker: EmbeddedBroker,
    tmp_path_factory: pytest.TempPathFactory,
) -> KafkaTools:
    directory = tmp_path_factory.mktemp("tools-secure-config")
    return KafkaTools(
        apache_kafka, secure_broker.bootstrap_for("SASL_PLAINTEXT"), write_log4j2(directory)
    )


def command_config(directory: Path, user: str, password: str, mechanism: str) -> str:
    """The properties file a Java client authenticates with (--command-config)."""
    path = directory / f"{user}-{mechanism}-{uuid.uuid4().hex[:6]}.properties"
    path.write_text(
        "security.protocol=SASL_PLAINTEXT\n"
        f"sasl.mechanism={mechanism}\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";\n'
    )
    return str(path)


def admin_args(tools: KafkaTools, tmp_path: Path) -> tuple[str, ...]:
    config = command_config(tmp_path, *ADMIN, "SCRAM-SHA-256")
    return ("--bootstrap-server", tools.bootstrap, "--command-config", config)


def test_kafka_configs_scram_users(tools: KafkaTools, tmp_path: Path) -> None:
    user, password = f"user-{uuid.uuid4().hex[:6]}", "its-secret"
    admin = admin_args(tools, tmp_path)
    entity = ("--entity-type", "users", "--entity-name", user)
    for mechanism in ("SCRAM-SHA-256=[iterations=8192,password=%s]", "SCRAM-SHA-512=[password=%s]"):
        altered = tools.ok(
            CONFIGS, *admin, *entity, "--alter", "--add-config", mechanism % password
        )
        assert f"Completed updating config for user {user}." in altered.stdout
    described = tools.ok(CONFIGS, *admin, *entity, "--describe")
    assert described.lines() == [
        f"SCRAM credential configs for user-principal '{user}' are "
        "SCRAM-SHA-256=iterations=8192, SCRAM-SHA-512=iterations=4096"
    ]
    everyone = tools.ok(CONFIGS, *admin, "--entity-type", "users", "--describe").lines()
    assert (
        f"SCRAM credential configs for user-principal '{ADMIN[0]}' are "
        + ("SCRAM-SHA-256=iterations=8192")
        in everyone
    )
    # Two mechanisms of one user in one request: Kafka's controller refuses it too
    # (ScramControlManager: one alteration per user and request).
    both = tools.run(
        CONFIGS, *admin, *entity, "--alter", "--add-config",
        f"SCRAM-SHA-256=[password={password}],SCRAM-SHA-512=[password={password}]",
    )  # fmt: skip
    assert both.returncode == 1
    assert "A user credential cannot be altered twice in the same request" in both.stderr

    # The new user authenticates with either mechanism (listing topics needs no ACL).
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        config = command_config(tmp_path, user, password, mechanism)
        tools.ok(
            TOPICS, "--bootstrap-server", tools.bootstrap, "--command-config", config, "--list"
        )

    tools.ok(CONFIGS, *admin, *entity, "--alter", "--delete-config", "SCRAM-SHA-512")
    assert tools.ok(CONFIGS, *admin, *entity, "--describe").lines() == [
        f"SCRAM credential configs for user-principal '{user}' are SCRAM-SHA-256=iterations=8192"
    ]
    config = command_config(tmp_path, user, password, "SCRAM-SHA-512")
    refused = tools.run(
        TOPICS, "--bootstrap-server", tools.bootstrap, "--command-config", config, "--list"
    )
    assert refused.returncode == 1
    assert "Authentication failed" in refused.stdout + refused.stderr, refused


def acl_blocks(text: str) -> dict[str, set[str]]:
    """kafka-acls --list: {resource pattern: {'(principal=..., operation=..., ...)' lines}}."""
    blocks: dict[str, set[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("Current ACLs for resource `"):
            current = line.split("`")[1]
            blocks[current] = set()
        elif line.strip().startswith("(principal=") and current is not None:
            blocks[current].add(line.strip())
    return blocks


def test_kafka_acls_add_list_remove(
    tools: KafkaTools, secure_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    user, password = f"acl-{uuid.uuid4().hex[:6]}", "acl-secret"
    admin = admin_args(tools, tmp_path)
    tools.ok(
        CONFIGS, *admin, "--entity-type", "users", "--entity-name", user, "--alter",
        "--add-config", f"SCRAM-SHA-512=[password={password}]",
    )  # fmt: skip
    topic = f"acl-topic-{uuid.uuid4().hex[:6]}"
    tools.ok(TOPICS, *admin, "--create", "--topic", topic, "--partitions", "1")

    def produce() -> None:
        producer = Producer(
            {
                "bootstrap.servers": tools.bootstrap,
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": user,
                "sasl.password": password,
                "message.timeout.ms": 20000,
                **QUIET,
            }
        )
        errors: list[KafkaError] = []
        producer.produce(topic, value=b"v", on_delivery=lambda err, _: errors.append(err))
        producer.flush(30)
        if errors[0] is not None:
            raise KafkaException(errors[0])

    with pytest.raises(KafkaException) as denied:
        produce()
    assert denied.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    principal = f"User:{user}"
    added = tools.ok(
        ACLS, *admin, "--add", "--allow-principal", principal, "--producer", "--topic", topic
    )
    assert f"Adding ACLs for resource `ResourcePattern(resourceType=TOPIC, name={topic}, " in (
        added.stdout
    )
    tools.ok(
        ACLS, *admin, "--add", "--deny-principal", principal, "--operation", "Read",
        "--topic", topic[:9], "--resource-pattern-type", "prefixed",
    )  # fmt: skip
    listed = acl_blocks(tools.ok(ACLS, *admin, "--list", "--principal", principal).stdout)
    literal = f"ResourcePattern(resourceType=TOPIC, name={topic}, patternType=LITERAL)"
    prefixed = f"ResourcePattern(resourceType=TOPIC, name={topic[:9]}, patternType=PREFIXED)"
    assert listed == {
        literal: {
            f"(principal={principal}, host=*, operation={op}, permissionType=ALLOW)"
            for op in ("WRITE", "DESCRIBE", "CREATE")
        },
        prefixed: {f"(principal={principal}, host=*, operation=READ, permissionType=DENY)"},
    }
    produce()  # allowed now

    tools.ok(ACLS, *admin, "--remove", "--force", "--allow-principal", principal, "--producer",
             "--topic", topic)  # fmt: skip
    listed = acl_blocks(tools.ok(ACLS, *admin, "--list", "--principal", principal).stdout)
    assert set(listed) == {prefixed}
    with pytest.raises(KafkaException) as again:
        produce()
    assert again.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
