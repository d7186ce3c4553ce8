"""DescribeConfigs with include_synonyms (the Java AdminClient's describeConfigs, kafka-configs'
`synonyms={...}`): a topic config lists its own value, then the broker setting it defaults to,
set on the broker (STATIC_BROKER_CONFIG) or left at Kafka's default (DEFAULT_CONFIG)."""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

from onceflow.broker.embedded import EmbeddedBroker
from tests.confluent import QUIET, create_topic


def synonyms(bootstrap: str, resource: ConfigResource) -> dict[str, list[tuple[str, str, int]]]:
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    (future,) = admin.describe_configs([resource]).values()
    return {
        name: [(s.name, s.value, s.source) for s in entry.synonyms.values()]
        for name, entry in future.result(timeout=30).items()
    }


def test_topic_config_synonyms(make_broker: Callable[..., EmbeddedBroker], topic_name: str) -> None:
    broker = make_broker(settings={"log.retention.bytes": "100000000"})
    create_topic(broker.bootstrap, topic_name, **{"max.message.bytes": "2000000"})
    found = synonyms(broker.bootstrap, ConfigResource(ConfigResource.Type.TOPIC, topic_name))
    assert found["max.message.bytes"] == [
        ("max.message.bytes", "2000000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
        ("message.max.bytes", "1048588", ConfigSource.DEFAULT_CONFIG.value),
    ]
    assert found["retention.bytes"] == [
        ("log.retention.bytes", "100000000", ConfigSource.STATIC_BROKER_CONFIG.value)
    ]
    assert found["cleanup.policy"] == [
        ("log.cleanup.policy", "delete", ConfigSource.DEFAULT_CONFIG.value)
    ]
    on_broker = synonyms(broker.bootstrap, ConfigResource(ConfigResource.Type.BROKER, "0"))
    assert on_broker["log.retention.bytes"] == [
        ("log.retention.bytes", "100000000", ConfigSource.STATIC_BROKER_CONFIG.value)
    ]
