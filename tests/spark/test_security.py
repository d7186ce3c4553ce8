"""The exactly-once source and sink against a SASL_SSL (SCRAM-SHA-512) broker with ACLs.

The user `pipeline` holds exactly the ACLs a copy pipeline needs (PIPELINE_ACLS, the list the
README gives); `admin` (a super user) sets up and reads back; `nobody` has no ACL at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from onceflow.broker.embedded import EmbeddedBroker
from tests.security.brokers import authorizing, broker_with_users
from tests.security.certs import Certs, broker_tls_settings, make_certs

from .copy_job import check_output
from .faults import fail_first_attempt
from .kafka_io import create_topic, end_offsets, produce, read_values

MECHANISM = "SCRAM-SHA-512"
PASSWORDS = {"admin": "admin-pw", "pipeline": "pipeline-pw", "nobody": "nobody-pw"}
SOURCE, OUTPUT, PREFIX = "secure-in", "secure-out", "secure-copy"
TIMEOUT_S = 30.0

_LIT, _PRE = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
PIPELINE_ACLS = (
    # source: Metadata + ListOffsets (Describe, implied by Read) and Fetch
    (ResourceType.TOPIC, SOURCE, _LIT, AclOperation.READ),
    # sink: Produce and AddPartitionsToTxn (Write); the done-mark is a transactional offset
    # of partition 0 of the output topic: TxnOffsetCommit needs Read on it
    (ResourceType.TOPIC, OUTPUT, _LIT, AclOperation.WRITE),
    (ResourceType.TOPIC, OUTPUT, _LIT, AclOperation.READ),
    # sink tasks: transactional.id = f"{prefix}-{partition}"
    (ResourceType.TRANSACTIONAL_ID, f"{PREFIX}-", _PRE, AclOperation.WRITE),
    # done-mark groups = f"onceflow-sink.{prefix}.{partition}" (AddOffsetsToTxn, OffsetFetch)
    (ResourceType.GROUP, f"onceflow-sink.{PREFIX}.", _PRE, AclOperation.READ),
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[EmbeddedBroker]:
    data_dir = tmp_path_factory.mktemp("secured") / "data"
    users = {name: (password, (MECHANISM,)) for name, password in PASSWORDS.items()}
    with broker_with_users(
        data_dir,
        users,
        listeners="SASL_SSL://127.0.0.1:0",
        settings={
            **broker_tls_settings(certs),
            "sasl.enabled.mechanisms": MECHANISM,
            **authorizing("admin"),
        },
    ) as broker:
        yield broker


def client(certs: Certs, user: str) -> dict[str, str]:
    """librdkafka settings of `user` (without bootstrap.servers)."""
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": MECHANISM,
        "sasl.username": user,
        "sasl.password": PASSWORDS[user],
        "ssl.ca.location": str(certs.ca),
    }


def spark_options(broker: EmbeddedBroker, certs: Certs, user: str) -> dict[str, str]:
    """The same, as the `kafka.`-prefixed options of the onceflow source and sink."""
    settings = {"bootstrap.servers": broker.bootstrap, **client(certs, user)}
    return {f"kafka.{key}": value for key, value in settings.items()}


@pytest.fixture(scope="module")
def topics(secured: EmbeddedBroker, certs: Certs) -> list[str]:
    admin_client = client(certs, "admin")
    for topic in (SOURCE, OUTPUT):
        create_topic(secured.bootstrap, topic, 2, admin_client)
    values = [f"r{i}-" + "x" * 1000 for i in range(400)]
    produce(secured.bootstrap, SOURCE, values, config=admin_client)
    admin = AdminClient({"bootstrap.servers": secured.bootstrap, **admin_client})
    bindings = [
        AclBinding(kind, name, pattern, "User:pipeline", "*", op, AclPermissionType.ALLOW)
        for kind, name, pattern, op in PIPELINE_ACLS
    ]
    for future in admin.create_acls(bindings).values():
        future.result(TIMEOUT_S)
    return values


def test_copy_as_a_user_with_only_the_pipeline_acls_is_exactly_once(
    spark: SparkSession,
    secured: EmbeddedBroker,
    certs: Certs,
    topics: list[str],
    tmp_path: Path,
    small_arrow_batches: None,
) -> None:
    options = spark_options(secured, certs, "pipeline")
    df = (
        spark.readStream.format("onceflow")
        .options(**options)
        .option("subscribe", SOURCE)
        .option("startingOffsets", "earliest")
        .load()
        .select("key", "value")
    )
    # the fault: the first attempt of every task fails after handing 150 rows to the sink
    df = df.mapInArrow(fail_first_attempt(150), df.schema)
    query = (
        df.writeStream.format("onceflow")
        .options(**options)
        .option("topic", OUTPUT)
        .option("transactional.id.prefix", PREFIX)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    admin = client(certs, "admin")
    # read_committed: every row exactly once, nothing of an aborted attempt
    check_output(read_values(secured.bootstrap, OUTPUT, config=admin), topics, exactly_once=True)
    # A first attempt whose input ends early commits what it got (then its retry the rest) or
    # is aborted: either way more transactions, so more markers, than the two tasks' commits
    # (one marker per output partition each) of a run without the fault.
    records = read_values(secured.bootstrap, OUTPUT, "read_uncommitted", config=admin)
    markers = sum(end_offsets(secured.bootstrap, OUTPUT, "read_uncommitted", admin).values())
    markers -= len(records)
    assert markers > 2 * 2, f"{markers} markers: no task was retried, the test proves nothing"


def test_a_user_without_acls_gets_authorization_errors(
    spark: SparkSession, secured: EmbeddedBroker, certs: Certs, topics: list[str]
) -> None:
    options = spark_options(secured, certs, "nobody")
    df = spark.createDataFrame([("k", "v")], "key string, value string")
    writer = df.write.format("onceflow").options(**options).option("topic", OUTPUT)
    with pytest.raises((PySparkException, Py4JJavaError)) as failure:
        writer.mode("append").save()
    assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in str(failure.value)
    # the source fails too, rather than finding no partition and reading nothing
    reader = spark.read.format("onceflow").options(**options).option("subscribe", SOURCE)
    with pytest.raises((PySparkException, Py4JJavaError)) as failure:
        reader.load().collect()
    assert "TOPIC_AUTHORIZATION_FAILED" in str(failure.value)
