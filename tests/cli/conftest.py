"""Fixtures for the `onceflow` command tests: a broker and a unique topic name.

The `bootstrap` broker is onceflow's own (the session broker of tests/conftest.py).
ONCEFLOW_TEST_BOOTSTRAP=HOST:PORT runs the tests against a broker that is already running
instead (Tansu, say: the tests skip what Tansu does not implement).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from onceflow.broker.embedded import EmbeddedBroker
from tests.cli.harness import Run, invoke

TANSU = "tansu"


@dataclass(frozen=True)
class CliBroker:
    bootstrap: str
    kind: str  # "onceflow", or "external" for ONCEFLOW_TEST_BOOTSTRAP


@pytest.fixture(scope="session")
def cli_broker(session_broker: EmbeddedBroker) -> Iterator[CliBroker]:
    external = os.environ.get("ONCEFLOW_TEST_BOOTSTRAP")
    if external:
        kind = os.environ.get("ONCEFLOW_TEST_BROKER_KIND", "external")
        yield CliBroker(external, kind)
        return
    yield CliBroker(session_broker.bootstrap, "onceflow")


@pytest.fixture
def bootstrap(cli_broker: CliBroker) -> str:
    """HOST:PORT of a running broker."""
    return cli_broker.bootstrap


@pytest.fixture
def topic() -> str:
    return f"cli-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def run() -> Run:
    return invoke
