"""Brokers with users: users made by `onceflow users set --data-dir` before the broker ever
started (as an operator bootstraps one), and the settings that turn the authorizer on."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from onceflow.broker.embedded import EmbeddedBroker

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def onceflow(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceflow.cli.main", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=60,
    )


def add_user(data_dir: Path, name: str, password: str, mechanism: str) -> None:
    result = onceflow(
        "users", "set", name, "--mechanism", mechanism, "--password-file", "-",
        "--data-dir", str(data_dir), stdin=password + "\n",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def authorizing(super_user: str | None) -> dict[str, str]:
    """Broker settings for Kafka's StandardAuthorizer, with `super_user` (a principal's name)."""
    settings = {"authorizer.class.name": AUTHORIZER}
    if super_user is not None:
        settings["super.users"] = f"User:{super_user}"
    return settings


@contextmanager
def broker_with_users(
    data_dir: Path, users: Mapping[str, tuple[str, tuple[str, ...]]], **broker: Any
) -> Iterator[EmbeddedBroker]:
    """A started broker whose `users` ({name: (password, SASL mechanisms)}) exist before its
    first start; `broker`: EmbeddedBroker's settings."""
    for name, (password, mechanisms) in users.items():
        for mechanism in mechanisms:
            add_user(data_dir, name, password, mechanism)
    with EmbeddedBroker(data_dir, **{"log_level": "INFO", **broker}) as started:
        yield started
