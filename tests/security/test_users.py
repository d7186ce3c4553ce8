"""Users: `onceflow users` on a stopped data directory and against a running broker,
AlterUserScramCredentials through confluent-kafka's AdminClient, and users surviving kill -9."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from onceflow.broker.embedded import EmbeddedBroker
from tests.security.brokers import add_user, onceflow
from tests.security.certs import Certs
from tests.security.conftest import ALL_LISTENERS, confluent_config, secure_settings
from tests.security.roundtrip import RECORDS, confluent_round_trip


def _authenticates(broker: EmbeddedBroker, certs: Certs, user: str, password: str) -> bool:
    config = confluent_config(broker, certs, "SASL_SSL", "SCRAM-SHA-256", user, password)
    try:
        AdminClient(config).list_topics(timeout=5)
    except KafkaException:
        return False
    return True


def test_users_cli_on_a_stopped_data_directory(tmp_path: Path) -> None:
    data_dir = tmp_path / "new"
    add_user(data_dir, "admin", "pw-1", "SCRAM-SHA-256")
    add_user(data_dir, "admin", "pw-2", "SCRAM-SHA-512")
    add_user(data_dir, "ops", "pw-3", "SCRAM-SHA-512")
    assert (data_dir / "meta.properties").exists()  # a broker can start on it
    listed = onceflow("users", "list", "--data-dir", str(data_dir))
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[2:]]
    assert rows == [
        ["admin", "SCRAM-SHA-256", "8192"],
        ["admin", "SCRAM-SHA-512", "8192"],
        ["ops", "SCRAM-SHA-512", "8192"],
    ]
    stored = (data_dir / "scram-credentials.json").read_text()
    assert "pw-1" not in stored and "pw-3" not in stored
    deleted = onceflow(
        "users", "delete", "admin", "--mechanism", "SCRAM-SHA-512", "--data-dir", str(data_dir)
    )
    assert deleted.returncode == 0, deleted.stderr
    deleted = onceflow("users", "delete", "ops", "--data-dir", str(data_dir))
    assert deleted.returncode == 0, deleted.stderr
    listed = onceflow("users", "list", "--data-dir", str(data_dir))
    assert [line.split() for line in listed.stdout.splitlines()[2:]] == [
        ["admin", "SCRAM-SHA-256", "8192"]
    ]


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["set", "u", "--mechanism", "MD5", "--password-file", "-"], "pw\n", "--mechanism MD5"),
        (["set", "u", "--password-file", "-"], "\n", "is empty"),
        (["set", "u", "--password-file", "/nonexistent/pw"], None, "No such file"),
        (["set", "u", "--iterations", "100", "--password-file", "-"], "pw\n", "between 4096"),
        (["delete", "nobody"], None, "has no SCRAM"),
        (["set", "u", "--password-file", "-", "-b", "127.0.0.1:1"], "pw\n", "not both"),
    ],
)
def test_users_cli_refuses_bad_input_in_one_line(
    tmp_path: Path, args: list[str], stdin: str | None, message: str
) -> None:
    add_user(tmp_path / "d", "someone", "pw", "SCRAM-SHA-256")
    result = onceflow("users", *args, "--data-dir", str(tmp_path / "d"), stdin=stdin)
    assert result.returncode != 0
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_users_cli_refuses_a_directory_that_is_not_onceflows(tmp_path: Path) -> None:
    (tmp_path / "someone-elses-file").write_text("x")
    result = onceflow(
        "users", "set", "u", "--password-file", "-", "--data-dir", str(tmp_path), stdin="pw\n"
    )
    assert result.returncode == 1
    assert "not an onceflow data directory" in result.stderr
    assert not (tmp_path / "scram-credentials.json").exists()


def test_users_cli_against_a_running_broker(secure_broker: EmbeddedBroker, certs: Certs) -> None:
    bootstrap = ["-b", secure_broker.bootstrap_for("PLAINTEXT")]
    made = onceflow("users", "set", "carol", "--password-file", "-", *bootstrap, stdin="carol-pw\n")
    assert made.returncode == 0, made.stderr
    listed = onceflow("users", "list", *bootstrap)
    assert ["carol", "SCRAM-SHA-256", "8192"] in [
        line.split() for line in listed.stdout.splitlines()
    ]
    assert _authenticates(secure_broker, certs, "carol", "carol-pw")
    deleted = onceflow("users", "delete", "carol", *bootstrap)
    assert deleted.returncode == 0, deleted.stderr
    assert not _authenticates(secure_broker, certs, "carol", "carol-pw")


def test_users_made_with_the_admin_client_survive_kill_9(
    make_broker: Callable[..., EmbeddedBroker], certs: Certs, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    add_user(data_dir, "admin", "admin-pw", "SCRAM-SHA-256")
    broker = make_broker(data_dir, listeners=ALL_LISTENERS, settings=secure_settings(certs))
    # An authenticated SASL user may alter credentials (until ACLs: then super.users / Alter).
    admin = AdminClient(
        confluent_config(broker, certs, "SASL_SSL", "SCRAM-SHA-256", "admin", "admin-pw")
    )
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    futures = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion("dave", info, b"dave-pw")]
    )
    futures["dave"].result(30)
    described = admin.describe_user_scram_credentials(["dave"])["dave"].result(30)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_256, 4096)
    ]
    # Kafka's errors reach the client: too few iterations, deleting what does not exist.
    bad = admin.alter_user_scram_credentials(
        [
            UserScramCredentialUpsertion(
                "erin", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000), b"x"
            ),
            UserScramCredentialDeletion("zed", ScramMechanism.SCRAM_SHA_512),
        ]
    )
    for user, text in (("erin", "Too few iterations"), ("zed", "does not exist")):
        with pytest.raises(KafkaException, match=text):
            bad[user].result(30)
    broker.kill()
    broker.start()
    assert _authenticates(broker, certs, "dave", "dave-pw")
    assert not _authenticates(broker, certs, "dave", "wrong-pw")
    config = confluent_config(broker, certs, "SASL_SSL", "SCRAM-SHA-256", "dave", "dave-pw")
    assert confluent_round_trip(config) == RECORDS
