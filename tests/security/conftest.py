"""A broker with every kind of listener, on a data directory whose first users were made by
`onceflow users set --data-dir` before it ever started (as an operator bootstraps one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from onceflow.broker.embedded import EmbeddedBroker
from tests.security.brokers import broker_with_users
from tests.security.certs import Certs, broker_tls_settings, make_certs

ALL_LISTENERS = (
    "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0"
)
MECHANISMS = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
# alice has both SCRAM mechanisms; bob only SCRAM-SHA-512 (PLAIN works for both).
USERS = {
    "alice": ("alice-secret", ("SCRAM-SHA-256", "SCRAM-SHA-512")),
    "bob": ("bob-pw", ("SCRAM-SHA-512",)),
}


def secure_settings(certs: Certs, client_auth: str = "requested") -> dict[str, str]:
    return {
        **broker_tls_settings(certs, client_auth),
        "sasl.enabled.mechanisms": MECHANISMS,
        "group.initial.rebalance.delay.ms": "0",
    }


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def secure_broker(
    tmp_path_factory: pytest.TempPathFactory, certs: Certs
) -> Iterator[EmbeddedBroker]:
    data_dir = tmp_path_factory.mktemp("secure") / "data"
    with broker_with_users(
        data_dir, USERS, listeners=ALL_LISTENERS, settings=secure_settings(certs)
    ) as broker:
        yield broker


def confluent_config(
    broker: EmbeddedBroker,
    certs: Certs,
    protocol: str,
    mechanism: str | None = None,
    user: str = "alice",
    password: str | None = None,
    client_cert: tuple[Path, Path] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """librdkafka settings for one of the broker's listeners (named as its protocol)."""
    config: dict[str, Any] = {
        "bootstrap.servers": broker.bootstrap_for(protocol),
        "security.protocol": protocol,
        **extra,
    }
    if "SSL" in protocol:
        config["ssl.ca.location"] = str(certs.ca)
    if client_cert is not None:
        config["ssl.certificate.location"] = str(client_cert[0])
        config["ssl.key.location"] = str(client_cert[1])
    if mechanism is not None:
        config.update(
            {
                "sasl.mechanism": mechanism,
                "sasl.username": user,
                "sasl.password": USERS[user][0] if password is None else password,
            }
        )
    return config
