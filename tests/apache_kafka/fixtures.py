"""Apache Kafka in the tests: the jars (skipped, naming what is missing, when java or mvn are
absent; a failure under CI, which must run these tests) and one 3-node cluster per test session.

Loaded from tests/conftest.py (pytest_plugins), so tests/apache_kafka and tests/spark share the
cluster: the scheduler there runs both on one worker."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from onceflow.apache_kafka import Distribution, KafkaCluster, MissingTool, locate


def require(find: Callable[[], Distribution], what: str = "Apache Kafka") -> Distribution:
    """The jars `find` gives (fetched now if need be), or a skip naming what is missing; under
    CI a failure instead: CI must run these tests."""
    try:
        return find()
    except MissingTool as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the {what} tests, but {e}", pytrace=False)
        pytest.skip(f"{what} tests skipped: {e}")


def require_apache_kafka() -> Distribution:
    """Kafka's jars, or a skip (a failure under CI) naming what is missing."""
    return require(locate)


@pytest.fixture(scope="session")
def apache_kafka() -> Distribution:
    return require_apache_kafka()


@pytest.fixture(scope="session")
def _kafka_cluster3(
    apache_kafka: Distribution, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka3"), 3, distribution=apache_kafka)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def kafka_cluster3(_kafka_cluster3: KafkaCluster) -> Iterator[KafkaCluster]:
    """The session's 3-node cluster, every node up; whatever a test kills or pauses is brought
    back afterwards for the next test."""
    _kafka_cluster3.ensure_running()
    yield _kafka_cluster3
    _kafka_cluster3.ensure_running()
