"""Shared fixtures: brokers started as child processes on free ports in temporary directories."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from onceflow.broker.embedded import EmbeddedBroker

# Property tests are judged by what they find, never by how fast one example ran: under two
# xdist workers on a loaded 2-core machine an example took 875 ms against Hypothesis's 200 ms
# deadline (DeadlineExceeded, then FlakyFailure on the replay). "ci", the default, has no
# deadline and a fixed seed per test (the same examples every run, counts as each test sets);
# HYPOTHESIS_PROFILE=explore draws new examples each run, to hunt for bugs.
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Apache Kafka's fixtures, defined once so that every test shares one 3-node cluster.
pytest_plugins = ["tests.apache_kafka.fixtures"]


# The long groups of tests that start JVMs, each kept on one worker (see below), collected
# first so that the two start at once on the two workers while the short tests fill in.
JVM_GROUPS = ("tests/apache_kafka/", "tests/spark/")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist (`-n 2` in pyproject.toml): every Spark test on one worker, so one
    SparkSession (one JVM) serves them all and one 3-node Kafka cluster the Spark tests on
    Kafka; every Apache Kafka test (tools, Streams, MirrorMaker, conformance, verify) on one
    worker, likely the other, so the long JVM work runs on both; the other tests are balanced
    one by one, as `--dist load` does. (xdist_group marks with `--dist loadgroup` did not group
    them here, xdist 3.8 under pytest 9.)"""
    from xdist.scheduler import LoadScopeScheduling

    class JvmGroupsOnOneWorkerEach(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return next((g for g in JVM_GROUPS if nodeid.startswith(g)), nodeid)

    return JvmGroupsOnOneWorkerEach(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The JVM groups first: xdist hands out the first work units in turn, so each of the two
    long groups starts at once on its own worker."""
    items.sort(key=lambda item: not item.nodeid.startswith(JVM_GROUPS))


@pytest.fixture(scope="session")
def session_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """One broker shared by tests that only need a working broker (unique topics each)."""
    broker = EmbeddedBroker(
        tmp_path_factory.mktemp("broker"),
        settings={"group.initial.rebalance.delay.ms": "0"},
    )
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def bootstrap(session_broker: EmbeddedBroker) -> str:
    return session_broker.bootstrap


@pytest.fixture(scope="module")
def kip848_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A broker for KIP-848 groups, one per module: heartbeats every 500 ms (Kafka's default is
    5 s), since each step of a rebalance is a heartbeat."""
    broker = EmbeddedBroker(
        tmp_path_factory.mktemp("kip848"),
        settings={"group.consumer.heartbeat.interval.ms": "500"},
    )
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[Callable[..., EmbeddedBroker]]:
    """Start brokers owned by one test (for kill -9 and restart tests)."""
    started: list[EmbeddedBroker] = []

    def make(data_dir: Path | None = None, **kwargs: object) -> EmbeddedBroker:
        settings = {"group.initial.rebalance.delay.ms": "0", **kwargs.pop("settings", {})}
        broker = EmbeddedBroker(
            data_dir or tmp_path / f"data-{len(started)}", settings=settings, **kwargs
        )
        started.append(broker)
        return broker.start()

    yield make
    for broker in started:
        broker.kill()


@pytest.fixture
def topic_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"
