"""The mirror tells one cluster from two by cluster id, and never mirrors its own copies:
the identity policy onto the same cluster is refused, the default policy leaves out the
topics whose names say they came from there (MirrorMaker 2's cycle detection)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.librdkafka_log import QUIET
from onceflow.mirror.replication_policy import subscription_pattern
from onceflow.pipelines.mirror import MirrorLoopError, cluster_id, same_cluster


def test_cluster_ids_are_stable_across_restarts_and_distinct(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    one, two = make_broker(tmp_path / "one"), make_broker(tmp_path / "two")
    first = cluster_id("source", one.bootstrap, {}, 10)
    assert first and first != cluster_id("target", two.bootstrap, {}, 10)
    # what a Kafka AdminClient's describeCluster() says too
    admin = AdminClient({"bootstrap.servers": one.bootstrap, "logger": QUIET})
    assert admin.describe_cluster(request_timeout=10).result(30).cluster_id == first
    one.restart()
    assert cluster_id("source", one.bootstrap, {}, 10) == first


def test_same_cluster_by_id_whatever_the_address(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    one, two = make_broker(tmp_path / "one"), make_broker(tmp_path / "two")
    here, also_here = one.bootstrap, f"localhost:{one.port}"
    assert same_cluster(source=here, target=also_here, policy="default")
    assert not same_cluster(source=here, target=two.bootstrap, policy="identity")
    with pytest.raises(MirrorLoopError, match=r"same cluster .*identity"):
        same_cluster(source=here, target=also_here, policy="identity")


def test_a_cluster_onto_itself_leaves_out_the_mirrors_own_topics() -> None:
    names = [
        "orders",
        "source.orders",  # a copy: source.orders would become source.source.orders...
        "eu.source.orders",  # a copy of a copy (MirrorMaker 2 follows the chain upstream)
        "eu.orders",
        "sources.orders",
        "xsource.orders",
        "source",
    ]
    pattern = subscription_pattern(".*", "source")
    assert [n for n in names if re.fullmatch(pattern, n)] == [
        "orders",
        "eu.orders",
        "sources.orders",
        "xsource.orders",
        "source",
    ]
    assert all(re.fullmatch(subscription_pattern(".*"), n) for n in names)
    # the alias is a name, not a regex
    assert re.fullmatch(subscription_pattern(".*", "s+"), "ss.orders")
