"""The admin APIs Kafka's own tools need, under Kafka's StandardAuthorizer: DeleteRecords needs
DELETE on the topic (else TOPIC_AUTHORIZATION_FAILED, nothing deleted), DescribeClientQuotas
DESCRIBE_CONFIGS on the Cluster (else CLUSTER_AUTHORIZATION_FAILED); the super user has both."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.delete_records.v2.request import (
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
)
from kio.schema.describe_client_quotas.v1.request import DescribeClientQuotasRequest
from kio.schema.errors import ErrorCode
from kio.schema.types import TopicName
from kio.static.primitive import i32, i32Timedelta, i64

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.protocol.client import BrokerConnection
from onceflow.protocol.client_security import ClientSecurity
from tests.confluent import create_topic, produce
from tests.security.brokers import authorizing, broker_with_users

USERS = {"admin": ("admin-pw", ("SCRAM-SHA-256",)), "bob": ("bob-pw", ("SCRAM-SHA-256",))}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    data_dir = tmp_path_factory.mktemp("admin-acls") / "data"
    with broker_with_users(
        data_dir,
        USERS,
        listeners="PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        settings={
            "sasl.enabled.mechanisms": "SCRAM-SHA-256",
            # PLAINTEXT is User:ANONYMOUS, made super to set the topic up.
            **authorizing(None),
            "super.users": "User:admin;User:ANONYMOUS",
        },
    ) as started:
        yield started


def send_as(broker: EmbeddedBroker, user: str, request: Any) -> Any:
    host, port = broker.bootstrap_for("SASL_PLAINTEXT").rsplit(":", 1)
    security = ClientSecurity("SASL_PLAINTEXT", "SCRAM-SHA-256", user, USERS[user][0])
    with BrokerConnection.connect(host, int(port), client_id="tests", security=security) as c:
        return c.send(request)


def deletion(topic: str, offset: int) -> DeleteRecordsRequest:
    return DeleteRecordsRequest(
        topics=(
            DeleteRecordsTopic(
                name=TopicName(topic),
                partitions=(DeleteRecordsPartition(partition_index=i32(0), offset=i64(offset)),),
            ),
        ),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
    )


def test_delete_records_needs_delete_on_the_topic(broker: EmbeddedBroker, topic_name: str) -> None:
    plain = broker.bootstrap_for("PLAINTEXT")
    create_topic(plain, topic_name)
    produce(plain, topic_name, [b"a", b"b", b"c"])
    (refused,) = send_as(broker, "bob", deletion(topic_name, 2)).topics[0].partitions
    assert (refused.error_code, refused.low_watermark) == (
        ErrorCode.topic_authorization_failed,
        -1,
    )
    (done,) = send_as(broker, "admin", deletion(topic_name, 2)).topics[0].partitions
    assert (done.error_code, done.low_watermark) == (ErrorCode.none, 2)


def test_describe_client_quotas_needs_describe_configs_on_the_cluster(
    broker: EmbeddedBroker,
) -> None:
    request = DescribeClientQuotasRequest(components=(), strict=False)
    refused = send_as(broker, "bob", request)
    assert (refused.error_code, refused.entries) == (ErrorCode.cluster_authorization_failed, None)
    allowed = send_as(broker, "admin", request)
    assert (allowed.error_code, allowed.entries) == (ErrorCode.none, ())
