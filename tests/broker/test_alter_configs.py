"""AlterConfigs and IncrementalAlterConfigs with confluent-kafka's AdminClient, DescribeConfigs'
sources, and Produce's refusal of keyless records on a compacted topic."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)

from onceflow.broker.embedded import EmbeddedBroker
from tests.confluent import Deliveries, consume_all, create_topic
from tests.waiting import wait_for

MakeBroker = Callable[..., EmbeddedBroker]
TIMEOUT = 15


def topic_resource(name: str, **ops: tuple[str | None, AlterConfigOpType]) -> ConfigResource:
    entries = [
        ConfigEntry(k.replace("_", "."), value, incremental_operation=op)
        for k, (value, op) in ops.items()
    ]
    return ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=entries)


def incremental(bootstrap: str, resource: ConfigResource, validate_only: bool = False) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.incremental_alter_configs([resource], validate_only=validate_only)
    futures[resource].result(timeout=TIMEOUT)


def describe(bootstrap: str, topic: str) -> dict[str, ConfigEntry]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin.describe_configs([resource])[resource].result(timeout=TIMEOUT)


def kafka_error(future_call: Callable[[], object]) -> KafkaError:
    with pytest.raises(KafkaException) as raised:
        future_call()
    return raised.value.args[0]


def test_incremental_set_append_subtract_delete(bootstrap: str, topic_name: str) -> None:
    create_topic(bootstrap, topic_name)
    before = describe(bootstrap, topic_name)
    assert before["cleanup.policy"].value == "delete"
    assert before["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    assert before["min.cleanable.dirty.ratio"].value == "0.5"
    assert before["delete.retention.ms"].value == "86400000"

    incremental(
        bootstrap,
        topic_resource(
            topic_name,
            retention_ms=("3600000", AlterConfigOpType.SET),
            cleanup_policy=("compact", AlterConfigOpType.APPEND),
            min_compaction_lag_ms=("1000", AlterConfigOpType.SET),
        ),
    )
    after = describe(bootstrap, topic_name)
    assert after["retention.ms"].value == "3600000"
    assert after["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert after["cleanup.policy"].value == "delete,compact"  # appended to the default
    assert after["cleanup.policy"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert after["min.compaction.lag.ms"].value == "1000"

    incremental(
        bootstrap,
        topic_resource(
            topic_name,
            retention_ms=(None, AlterConfigOpType.DELETE),
            cleanup_policy=("delete", AlterConfigOpType.SUBTRACT),
        ),
    )
    last = describe(bootstrap, topic_name)
    assert last["retention.ms"].value == "604800000"
    assert last["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert last["cleanup.policy"].value == "compact"
    assert last["min.compaction.lag.ms"].value == "1000"  # untouched by the second request


def test_legacy_alter_configs_replaces_the_whole_set(bootstrap: str, topic_name: str) -> None:
    create_topic(bootstrap, topic_name, **{"retention.ms": "3600000"})
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(
        ConfigResource.Type.TOPIC, topic_name, set_config={"cleanup.policy": "compact, delete"}
    )
    with pytest.warns(DeprecationWarning):  # the API still exists and Kafka still serves it
        admin.alter_configs([resource])[resource].result(timeout=TIMEOUT)
    configs = describe(bootstrap, topic_name)
    assert configs["cleanup.policy"].value == "compact, delete"  # as set
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value


def test_validate_only_changes_nothing(bootstrap: str, topic_name: str) -> None:
    create_topic(bootstrap, topic_name)
    incremental(
        bootstrap,
        topic_resource(topic_name, cleanup_policy=("compact", AlterConfigOpType.SET)),
        validate_only=True,
    )
    assert describe(bootstrap, topic_name)["cleanup.policy"].value == "delete"
    error = kafka_error(
        lambda: incremental(
            bootstrap,
            topic_resource(topic_name, cleanup_policy=("compacted", AlterConfigOpType.SET)),
            validate_only=True,
        )
    )
    assert error.code() == KafkaError.INVALID_CONFIG


@pytest.mark.parametrize(
    ("ops", "code", "message"),
    [
        ({"cleanup_policy": ("compact,shred", AlterConfigOpType.SET)}, "INVALID_CONFIG", "shred"),
        ({"retention_ms": ("soon", AlterConfigOpType.SET)}, "INVALID_CONFIG", "retention.ms"),
        ({"no_such_config": ("1", AlterConfigOpType.SET)}, "INVALID_CONFIG", "no.such.config"),
        ({"retention_ms": ("1", AlterConfigOpType.APPEND)}, "INVALID_CONFIG", "not LIST"),
        (
            {
                "min_compaction_lag_ms": ("10", AlterConfigOpType.SET),
                "max_compaction_lag_ms": ("5", AlterConfigOpType.SET),
            },
            "INVALID_CONFIG",
            "conflict",
        ),
    ],
)
def test_bad_changes_get_kafkas_errors_and_change_nothing(
    bootstrap: str,
    topic_name: str,
    ops: dict[str, tuple[str, AlterConfigOpType]],
    code: str,
    message: str,
) -> None:
    create_topic(bootstrap, topic_name)
    resource = topic_resource(topic_name, **ops, segment_ms=("1000", AlterConfigOpType.SET))
    error = kafka_error(lambda: incremental(bootstrap, resource))
    assert error.code() == getattr(KafkaError, code)
    assert message in error.str()
    # all or nothing for the resource: the good setting beside the bad one was not applied
    assert describe(bootstrap, topic_name)["segment.ms"].value == "604800000"


def test_unknown_topic_and_broker_resources(bootstrap: str, topic_name: str) -> None:
    error = kafka_error(
        lambda: incremental(
            bootstrap, topic_resource(topic_name, retention_ms=("1", AlterConfigOpType.SET))
        )
    )
    assert error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    admin = AdminClient({"bootstrap.servers": bootstrap})
    broker = ConfigResource(
        ConfigResource.Type.BROKER,
        "0",
        incremental_configs=[
            ConfigEntry("log.cleaner.threads", "2", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(KafkaException) as raised:
        admin.incremental_alter_configs([broker])[broker].result(timeout=TIMEOUT)
    assert raised.value.args[0].code() == KafkaError.INVALID_REQUEST
    assert "dynamically" in raised.value.args[0].str()


def test_broker_describes_the_cleaner_settings(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.BROKER, "0")
    configs = admin.describe_configs([resource])[resource].result(timeout=TIMEOUT)
    assert configs["log.cleanup.policy"].value == "delete"
    assert configs["log.cleaner.enable"].value == "true"
    assert configs["log.cleaner.threads"].value == "1"
    assert configs["log.cleaner.dedupe.buffer.size"].value == "134217728"
    assert configs["log.cleaner.min.cleanable.ratio"].value == "0.5"
    assert configs["log.cleaner.max.compaction.lag.ms"].value == str((1 << 63) - 1)
    assert configs["log.cleaner.threads"].is_read_only


def test_broker_defaults_for_topics_and_their_source(make_broker: MakeBroker) -> None:
    broker = make_broker(settings={"log.cleanup.policy": "compact"})
    create_topic(broker.bootstrap, "defaults")
    configs = describe(broker.bootstrap, "defaults")
    assert configs["cleanup.policy"].value == "compact"
    assert configs["cleanup.policy"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    # the topic's own setting wins over the broker's default
    create_topic(broker.bootstrap, "own", **{"cleanup.policy": "delete"})
    assert describe(broker.bootstrap, "own")["cleanup.policy"].value == "delete"


def test_changes_survive_kill_9(make_broker: MakeBroker) -> None:
    broker = make_broker()
    create_topic(broker.bootstrap, "durable")
    incremental(
        broker.bootstrap,
        topic_resource("durable", cleanup_policy=("compact", AlterConfigOpType.SET)),
    )
    broker.restart()  # SIGKILL, then start on the same data directory
    configs = describe(broker.bootstrap, "durable")
    assert configs["cleanup.policy"].value == "compact"
    assert configs["cleanup.policy"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def _log_files(data_dir: Path, topic: str) -> list[Path]:
    return sorted((data_dir / f"{topic}-0").glob("*.log"))


def test_changes_apply_to_the_live_partitions(make_broker: MakeBroker) -> None:
    broker = make_broker(settings={"log.retention.check.interval.ms": "100"})
    create_topic(broker.bootstrap, "live")
    old = int(time.time() * 1000) - 3_600_000
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(20):
        producer.produce("live", key=b"k%d" % i, value=b"x" * 200, timestamp=old)
        producer.flush(TIMEOUT)
    assert len(_log_files(broker.data_dir, "live")) == 1

    # segment.bytes: the next append rolls the segment that is now too big
    incremental(
        broker.bootstrap, topic_resource("live", segment_bytes=("1024", AlterConfigOpType.SET))
    )
    for i in range(20):
        producer.produce("live", key=b"k%d" % i, value=b"x" * 200, timestamp=old)
        producer.flush(TIMEOUT)
    assert len(_log_files(broker.data_dir, "live")) > 2

    # retention.ms: the next retention pass deletes the hour-old segments
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "watch"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition("live", 0), timeout=TIMEOUT)
        assert (low, high) == (0, 40)
        incremental(
            broker.bootstrap,
            topic_resource("live", retention_ms=("60000", AlterConfigOpType.SET)),
        )
        wait_for(
            lambda: (
                consumer.get_watermark_offsets(TopicPartition("live", 0), timeout=TIMEOUT)[0] == 40
            ),
            timeout=30,
        )
    finally:
        consumer.close()


def test_compacted_topic_refuses_keyless_records(bootstrap: str, topic_name: str) -> None:
    create_topic(bootstrap, topic_name, **{"cleanup.policy": "compact"})
    deliveries = Deliveries()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    producer.produce(topic_name, key=b"k", value=b"kept", on_delivery=deliveries)
    producer.flush(TIMEOUT)
    producer.produce(topic_name, value=b"keyless", on_delivery=deliveries)
    producer.flush(TIMEOUT)
    assert [offset for _, _, offset, _ in deliveries.acked] == [0]
    [(_, error)] = deliveries.failed
    assert error.code() == KafkaError.INVALID_RECORD
    # nothing of the refused batch was appended
    [msg] = consume_all(bootstrap, topic_name, 1, timeout=10)
    assert msg.key() == b"k" and msg.value() == b"kept"


def test_switching_a_topic_to_compact_refuses_keyless_records(
    bootstrap: str, topic_name: str
) -> None:
    create_topic(bootstrap, topic_name)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    producer.produce(topic_name, value=b"before")  # accepted while the policy is delete
    assert producer.flush(TIMEOUT) == 0
    incremental(
        bootstrap,
        topic_resource(topic_name, cleanup_policy=("compact", AlterConfigOpType.APPEND)),
    )
    errors: list[KafkaError] = []
    producer.produce(
        topic_name, value=b"after", on_delivery=lambda err, _: errors.append(err) if err else None
    )
    producer.flush(TIMEOUT)
    assert [e.code() for e in errors] == [KafkaError.INVALID_RECORD]
