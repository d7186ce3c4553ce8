"""`--command-config FILE`: every onceflow tool reaches a secured broker with the properties
file a Kafka user already has (Java names translated to librdkafka's), and a wrong one fails
in one line, with no secret in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.cli.consumer_group_admin import describe_consumer_group
from onceflow.client_properties import (
    ClientPropertiesError,
    librdkafka_settings,
    load_client_properties,
    parse_properties,
)
from onceflow.tools.clients import ClientErrors, Cluster, client_config, connect_admin
from tests.cli.harness import invoke
from tests.security.brokers import onceflow
from tests.security.certs import Certs
from tests.security.conftest import USERS

JAAS = 'org.apache.kafka.common.security.{module} required username="{user}" password="{pw}";'


def java_properties(certs: Certs, mechanism: str, user: str, password: str) -> str:
    """What a Java client's client.properties for SASL_SSL holds."""
    module = "plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule"
    return "\n".join(
        [
            "# a Kafka client.properties",
            "security.protocol=SASL_SSL",
            f"sasl.mechanism={mechanism}",
            "sasl.jaas.config=" + JAAS.format(module=module, user=user, pw=password),
            f"ssl.truststore.location={certs.ca}",
            "ssl.truststore.type=PEM",
            "",
        ]
    )


@pytest.fixture
def sasl_ssl(secure_broker: EmbeddedBroker) -> str:
    return secure_broker.bootstrap_for("SASL_SSL")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "client.properties"
    path.write_text(text)
    return path


# -- the file ------------------------------------------------------------------------------


def test_java_names_become_librdkafka_names() -> None:
    props = parse_properties(
        "! comment\n\nsecurity.protocol = SASL_SSL\nsasl.mechanism: SCRAM-SHA-256\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="al,ice" password="p=w";\n'
        "ssl.truststore.location=/ca.pem\nssl.keystore.location=/me.pem\n"
        "ssl.keystore.type=PEM\nssl.keystore.password=x\nssl.endpoint.identification.algorithm=\n"
    )
    assert librdkafka_settings(props, "f") == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "al,ice",
        "sasl.password": "p=w",
        "ssl.ca.location": "/ca.pem",
        "ssl.certificate.location": "/me.pem",
        "ssl.key.location": "/me.pem",
        "ssl.endpoint.identification.algorithm": "none",
    }


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("no.such.setting=1\n", "no.such.setting"),
        ("ssl.truststore.type=JKS\n", "JKS"),
        ("sasl.jaas.config=com.example.Login required;\n", "sasl.jaas.config"),
        ("=value\n", "line 1"),
    ],
)
def test_a_file_librdkafka_cannot_use_is_refused_naming_the_key(
    tmp_path: Path, text: str, named: str
) -> None:
    with pytest.raises(ClientPropertiesError, match=named):
        load_client_properties(write(tmp_path, text))


# -- the tools -----------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_every_tool_works_over_sasl_ssl_with_the_file(
    tmp_path: Path, certs: Certs, sasl_ssl: str, mechanism: str
) -> None:
    config = write(tmp_path, java_properties(certs, mechanism, "bob", USERS["bob"][0]))
    topic = f"cc-{mechanism.lower()}"
    common = ("-b", sasl_ssl, "--command-config", str(config))
    runs = [
        onceflow("topics", "create", topic, "--partitions", "2", *common),
        onceflow("topics", "list", *common),
        onceflow("produce", topic, *common, stdin="one\ntwo\n"),
        onceflow(
            "consume",
            topic,
            "--from-beginning",
            "--group",
            "g",
            "--max-messages",
            "2",
            "--timeout-ms",
            "20000",
            *common,
        ),
        onceflow("groups", "list", *common),
        onceflow("transactions", "list", *common),  # onceflow's own protocol client
        onceflow("users", "list", *common),
    ]
    for result in runs:
        assert result.returncode == 0, (result.args, result.stderr)
    assert topic in runs[1].stdout
    assert sorted(runs[3].stdout.split()) == ["one", "two"]
    assert "bob" in runs[6].stdout


@pytest.mark.parametrize("command", [("topics", "list"), ("transactions", "list")])
def test_a_wrong_password_fails_in_one_line_without_the_secret(
    tmp_path: Path, certs: Certs, sasl_ssl: str, command: tuple[str, ...]
) -> None:
    config = write(tmp_path, java_properties(certs, "SCRAM-SHA-256", "alice", "not-her-secret"))
    result = onceflow(*command, "-b", sasl_ssl, "--command-config", str(config))
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "uthentication" in lines[0], lines
    assert "not-her-secret" not in result.stderr + result.stdout


def test_without_the_file_a_secured_listener_is_not_reached(sasl_ssl: str) -> None:
    result = onceflow("topics", "list", "-b", sasl_ssl)
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("content", [None, "bogus.key=1\n"])
def test_a_missing_or_unusable_file_is_a_usage_error(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "client.properties"
    if content is not None:
        path.write_text(content)
    result = onceflow("topics", "list", "-b", "127.0.0.1:9", "--command-config", str(path))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "--command-config" in result.stderr


def test_an_in_process_run_leaves_no_settings_behind(
    tmp_path: Path, certs: Certs, secure_broker: EmbeddedBroker, sasl_ssl: str
) -> None:
    """The file's settings reach the command's clients as a value handed down, never as state
    of the process: a tool function called after an in-process CLI run with the file connects
    as it is told (here: PLAINTEXT, which a client still set for SASL_SSL cannot reach)."""
    config = write(tmp_path, java_properties(certs, "SCRAM-SHA-512", "bob", USERS["bob"][0]))
    ran = invoke("topics", "list", "-b", sasl_ssl, "--command-config", str(config))
    assert ran.exit_code == 0, ran.stderr

    plaintext = Cluster(secure_broker.bootstrap_for("PLAINTEXT"))
    assert "sasl.username" not in client_config(plaintext, ClientErrors())
    connect_admin(plaintext)  # BrokerUnreachableError with SASL_SSL settings left over
    assert describe_consumer_group(plaintext, "no-such-group") is None  # own protocol client
