"""The differential conformance suite: each scenario runs against onceflow and a 1-node Apache
Kafka 4.4 over the same wire requests, and the normalized transcripts must be equal, except for
the steps kept as differences (differences.py, with their reasons)."""

from __future__ import annotations

import pprint
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from onceflow.apache_kafka import Distribution, KafkaCluster
from onceflow.broker.embedded import EmbeddedBroker
from tests.apache_kafka.conformance.differences import kept_steps
from tests.apache_kafka.conformance.run import Run
from tests.apache_kafka.conformance.scenarios import SCENARIOS
from tests.apache_kafka.conformance.target import Target

# What the timing-dependent scenarios need on both brokers: timed-out transactions aborted
# within half a second, the cleaner every 200 ms, a group's first rebalance at once.
SETTINGS = {
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
    "log.cleaner.backoff.ms": "200",
    "group.initial.rebalance.delay.ms": "0",
}
# Kafka 4.3+ computes a consumer group's target assignment at most every
# group.consumer.assignment.interval.ms, in the background (KIP-1263); onceflow computes it
# in the heartbeat that needs it, as Kafka 4.0-4.2 did, which is Kafka at 0.
KAFKA_ONLY_SETTINGS = {"group.consumer.assignment.interval.ms": "0"}
UPDATE_FEATURES = (57, 1)
API_VERSIONS = (18, 3)
SAFE_DOWNGRADE = 2
# onceflow implements the classic transaction protocol (transaction.version 1); a new Kafka 4.x
# cluster finalizes version 2, which changes how the coordinator aborts a timed-out transaction
# even for clients of the classic protocol (its KIP-360 retry is then accepted).
TRANSACTION_VERSION = 1


def finalized_transaction_version(target: Target) -> int | None:
    response = target.call(
        *API_VERSIONS, client_software_name="conformance", client_software_version="1"
    )
    levels = {f.name: f.max_version_level for f in response.finalized_features}
    return levels.get("transaction.version")


@pytest.fixture(scope="module")
def kafka(apache_kafka: Distribution, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """One Kafka node for the module, at transaction.version 1."""
    cluster = KafkaCluster(
        tmp_path_factory.mktemp("kafka1"),
        1,
        distribution=apache_kafka,
        settings={**SETTINGS, **KAFKA_ONLY_SETTINGS},
    )
    target = Target("kafka", cluster.bootstrap_servers)
    try:
        cluster.start()
        response = target.call(
            *UPDATE_FEATURES,
            timeout=30_000,
            feature_updates=[
                {
                    "feature": "transaction.version",
                    "max_version_level": TRANSACTION_VERSION,
                    "upgrade_type": SAFE_DOWNGRADE,
                }
            ],
            validate_only=False,
        )
        assert response.error_code == ErrorCode.none, response
        deadline = time.monotonic() + 60
        while finalized_transaction_version(target) != TRANSACTION_VERSION:
            assert time.monotonic() < deadline, "transaction.version did not reach 1 in 60 s"
            time.sleep(0.1)
        yield target
    finally:
        target.close()
        cluster.stop()


@pytest.fixture(scope="module")
def onceflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    broker = EmbeddedBroker(Path(tmp_path_factory.mktemp("onceflow")), settings=SETTINGS)
    broker.start()
    target = Target("onceflow", broker.bootstrap)
    try:
        yield target
    finally:
        target.close()
        broker.stop()


def transcript(scenario: str, target: Target) -> dict[str, object]:
    run = Run(target)
    SCENARIOS[scenario](run)
    return dict(run.steps)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_onceflow_answers_as_apache_kafka(scenario: str, kafka: Target, onceflow: Target) -> None:
    expected = transcript(scenario, kafka)
    actual = transcript(scenario, onceflow)
    assert list(actual) == list(expected), "the scenario took other steps on each broker"
    differing = {step for step in expected if actual[step] != expected[step]}
    kept = kept_steps(scenario)
    unexpected = sorted(differing - set(kept), key=list(expected).index)
    report = "\n".join(
        f"step {step!r}:\n  kafka:    {pprint.pformat(expected[step])}\n"
        f"  onceflow: {pprint.pformat(actual[step])}"
        for step in unexpected
    )
    assert not unexpected, f"onceflow answers otherwise than Apache Kafka:\n{report}"
    agreeing = sorted(set(kept) - differing)
    assert not agreeing, f"kept differences that are no longer differences: {agreeing}"
