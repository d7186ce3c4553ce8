"""Hostile AlterConfigs / IncrementalAlterConfigs on the raw wire, and keyless records on a
compacted topic: each bad resource gets Kafka's error on its own, nothing is changed by a
refused resource, the broker answers another client afterwards."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator

import pytest
from kio.schema.alter_configs.v2.request import AlterableConfig as LegacyConfig
from kio.schema.alter_configs.v2.request import AlterConfigsRequest
from kio.schema.alter_configs.v2.request import AlterConfigsResource as LegacyResource
from kio.schema.describe_configs.v4.request import DescribeConfigsRequest, DescribeConfigsResource
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v1.request import (
    AlterableConfig,
    AlterConfigsResource,
    IncrementalAlterConfigsRequest,
)
from kio.schema.produce.v7.request import PartitionProduceData as PartitionProduceDataV7
from kio.schema.produce.v7.request import ProduceRequest as ProduceRequestV7
from kio.schema.produce.v7.request import TopicProduceData as TopicProduceDataV7

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.records.builder import build_batch
from tests.confluent import create_topic
from tests.wire import WireClient, api_versions, produce_request

TOPIC, BROKER = 2, 4
SET, DELETE, APPEND = 0, 1, 2
TS = 1_700_000_000_000


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    broker = EmbeddedBroker(tmp_path_factory.mktemp("configs"))
    broker.start()
    create_topic(broker.bootstrap, "plain")
    create_topic(broker.bootstrap, "compacted", **{"cleanup.policy": "compact"})
    yield broker
    broker.kill()


@pytest.fixture
def address(broker: EmbeddedBroker) -> Iterator[str]:
    before = _stored_configs(broker)
    yield broker.bootstrap
    # every hostile request here is refused whole: nothing stored changed, and the broker
    # answers another client
    assert _stored_configs(broker) == before
    assert 44 in api_versions(broker.bootstrap)


def _stored_configs(broker: EmbeddedBroker) -> dict[str, dict[str, str]]:
    state = json.loads((broker.data_dir / "topics.json").read_text())
    return {name: meta["configs"] for name, meta in state["topics"].items()}


def resource(
    name: str, *configs: tuple[str, int, str | None], kind: int = TOPIC
) -> AlterConfigsResource:
    return AlterConfigsResource(
        resource_type=kind,
        resource_name=name,
        configs=tuple(
            AlterableConfig(name=n, config_operation=op, value=v) for n, op, v in configs
        ),
    )


def incremental(address: str, *resources: AlterConfigsResource) -> list[tuple[ErrorCode, str]]:
    client = WireClient(address)
    try:
        response = client.call(
            IncrementalAlterConfigsRequest(resources=resources, validate_only=False)
        )
    finally:
        client.close()
    return [(r.error_code, r.error_message or "") for r in response.responses]


def describe(address: str, topic: str) -> dict[str, str]:
    client = WireClient(address)
    try:
        response = client.call(
            DescribeConfigsRequest(
                resources=(
                    DescribeConfigsResource(
                        resource_type=TOPIC, resource_name=topic, configuration_keys=None
                    ),
                ),
                include_synonyms=False,
                include_documentation=False,
            )
        )
    finally:
        client.close()
    [result] = response.results
    return {c.name: c.value for c in result.configs}


def test_unknown_resource_types_are_invalid_request_each(address: str) -> None:
    answers = incremental(
        address,
        resource("x", ("retention.ms", SET, "1"), kind=0),
        resource("x", ("retention.ms", SET, "1"), kind=99),
        resource("x", ("root", SET, "DEBUG"), kind=8),  # BROKER_LOGGER: no log4j here
        resource("plain", ("retention.ms", SET, "-7")),  # and one bad topic change beside
    )
    assert [code for code, _ in answers] == [ErrorCode.invalid_request] * 3 + [
        ErrorCode.invalid_config
    ]
    assert "Unknown resource type 99" in answers[1][1]


def test_duplicate_resources_are_invalid_request_for_every_entry(address: str) -> None:
    answers = incremental(
        address,
        resource("plain", ("retention.ms", SET, "1000")),
        resource("plain", ("retention.ms", SET, "2000")),
        resource("no-such-topic", ("retention.ms", SET, "1000")),
    )
    assert answers[0] == (ErrorCode.invalid_request, "Each resource must appear at most once.")
    assert answers[1] == answers[0]
    assert answers[2][0] == ErrorCode.unknown_topic_or_partition
    assert describe(address, "plain")["retention.ms"] == "604800000"


def test_duplicate_keys_null_values_and_unknown_operations(address: str) -> None:
    answers = incremental(
        address,
        resource("plain", ("retention.ms", SET, "1"), ("retention.ms", DELETE, None)),
    )
    assert answers == [(ErrorCode.invalid_request, "Error due to duplicate config keys")]
    [(code, message)] = incremental(address, resource("plain", ("retention.ms", SET, None)))
    assert code == ErrorCode.invalid_request and "Null value" in message
    [(code, message)] = incremental(address, resource("plain", ("retention.ms", 7, "1")))
    assert code == ErrorCode.invalid_request and "7" in message


@pytest.mark.parametrize(
    ("configs", "fragment"),
    [
        ((("cleanup.policy", SET, "compact,compact"),), "duplicated"),
        ((("cleanup.policy", SET, "COMPACT"),), "String must be one of"),
        ((("min.cleanable.dirty.ratio", SET, "Infinity"),), "min.cleanable.dirty.ratio"),
        ((("max.compaction.lag.ms", SET, "9223372036854775808"),), "LONG"),
        ((("segment.bytes", SET, "1"),), "segment.bytes"),
        ((("segment.ms", APPEND, "1"),), "not LIST"),
        ((("no.such.setting", SET, "1"),), "no.such.setting"),
    ],
)
def test_bad_values_are_invalid_config(
    address: str, configs: tuple[tuple[str, int, str], ...], fragment: str
) -> None:
    [(code, message)] = incremental(address, resource("plain", *configs))
    assert code == ErrorCode.invalid_config
    assert fragment in message


def test_topic_names(address: str) -> None:
    answers = incremental(
        address,
        resource("", ("retention.ms", SET, "1")),
        resource("bad name!", ("retention.ms", SET, "1")),
        resource("__consumer_offsets", ("retention.ms", SET, "1")),
    )
    assert [code for code, _ in answers] == [
        ErrorCode.invalid_request,  # "Default topic resources are not allowed."
        ErrorCode.invalid_topic_exception,
        ErrorCode.unknown_topic_or_partition,  # internal logs are no registered topics
    ]


def test_broker_resources_are_static(address: str) -> None:
    answers = incremental(
        address,
        resource("0", ("log.retention.ms", SET, "1"), kind=BROKER),
        resource("7", kind=BROKER),
        resource("zero", kind=BROKER),
        resource("", kind=BROKER),  # nothing to change: Kafka answers success
    )
    assert [code for code, _ in answers] == [ErrorCode.invalid_request] * 3 + [ErrorCode.none]
    assert "dynamically" in answers[0][1]
    assert "expected 0" in answers[1][1]


def test_huge_numbers_of_configs_are_refused_with_a_bounded_message(address: str) -> None:
    many = 100_000
    distinct = resource("plain", *((f"name.{i}", SET, "1") for i in range(many)))
    same = resource("plain", *(("retention.ms", SET, "1") for _ in range(many)))
    nulls = resource("compacted", *((f"name.{i}", SET, None) for i in range(many)))
    [(code, message)] = incremental(address, distinct)
    assert code == ErrorCode.invalid_config and len(message) < 1000
    [(code, _)] = incremental(address, same)
    assert code == ErrorCode.invalid_request
    [(code, message)] = incremental(address, nulls)
    assert code == ErrorCode.invalid_request and len(message) < 1000


def test_legacy_alter_configs_refuses_as_kafka(address: str) -> None:
    client = WireClient(address)
    try:
        response = client.call(
            AlterConfigsRequest(
                resources=(
                    LegacyResource(
                        resource_type=TOPIC,
                        resource_name="plain",
                        configs=(LegacyConfig(name="cleanup.policy", value=None),),
                    ),
                    LegacyResource(
                        resource_type=TOPIC,
                        resource_name="plain-not-there",
                        configs=(LegacyConfig(name="cleanup.policy", value="compact"),),
                    ),
                ),
                validate_only=False,
            )
        )
    finally:
        client.close()
    assert [r.error_code for r in response.responses] == [
        ErrorCode.invalid_request,
        ErrorCode.unknown_topic_or_partition,
    ]


# -- keyless records on a compacted topic -----------------------------------------------------


def _keyless_batch(keys: list[bytes | None], compression: int = 0) -> bytes:
    return build_batch([(k, b"v", (), TS) for k in keys], compression=compression)


def _log_end(broker: EmbeddedBroker, topic: str) -> int:
    client = WireClient(broker.bootstrap)
    try:
        response = client.call(produce_request(topic, {0: _keyless_batch([b"probe"])}))
    finally:
        client.close()
    [part] = response.responses[0].partition_responses
    assert part.error_code == ErrorCode.none
    return part.base_offset


def test_keyless_records_are_named_in_record_errors(address: str, broker: EmbeddedBroker) -> None:
    before = _log_end(broker, "compacted")
    client = WireClient(address)
    try:
        batch = _keyless_batch([b"a", None, b"b", None], compression=4)
        response = client.call(produce_request("compacted", {0: batch}))
    finally:
        client.close()
    [part] = response.responses[0].partition_responses
    assert part.error_code == ErrorCode.invalid_record
    assert [e.batch_index for e in part.record_errors] == [1, 3]
    assert part.record_errors[0].batch_index_error_message == (
        "Compacted topic cannot accept message without key in topic partition compacted-0"
    )
    assert "2 record errors" in part.error_message
    assert _log_end(broker, "compacted") == before + 1  # only the probe was appended


def test_keyless_refusal_before_record_errors_existed(address: str) -> None:
    client = WireClient(address)
    try:
        response = client.call(
            ProduceRequestV7(
                transactional_id=None,
                acks=-1,
                timeout=datetime.timedelta(seconds=30),
                topic_data=(
                    TopicProduceDataV7(
                        name="compacted",
                        partition_data=(
                            PartitionProduceDataV7(index=0, records=_keyless_batch([None])),
                        ),
                    ),
                ),
            )
        )
    finally:
        client.close()
    assert response.responses[0].partition_responses[0].error_code == ErrorCode.invalid_record


def test_a_batch_of_many_keyless_records_gets_a_bounded_answer(address: str) -> None:
    many = 200_000
    client = WireClient(address)
    try:
        batch = _keyless_batch([None] * many, compression=4)  # zstd: a few KB on the wire
        response = client.call(produce_request("compacted", {0: batch}))
    finally:
        client.close()
    [part] = response.responses[0].partition_responses
    assert part.error_code == ErrorCode.invalid_record
    assert f"{many} record errors" in part.error_message
    assert [e.batch_index for e in part.record_errors] == list(range(1000))


def test_the_same_keyless_batch_is_accepted_by_a_delete_topic(address: str) -> None:
    client = WireClient(address)
    try:
        response = client.call(produce_request("plain", {0: _keyless_batch([None, None])}))
    finally:
        client.close()
    assert response.responses[0].partition_responses[0].error_code == ErrorCode.none
