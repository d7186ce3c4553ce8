"""ACLs on a running broker (StandardAuthorizer on, `super.users=User:admin`), through
confluent-kafka as users drive it: CreateAcls/DescribeAcls/DeleteAcls, the *_AUTHORIZATION_FAILED
codes for an authenticated user without ACLs, the full exactly-once path with the right ACLs,
Deny over Allow, PREFIXED patterns, and ACLs surviving kill -9."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kafka.admin import (
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as KpResourceType
from kafka.errors import ClusterAuthorizationFailedError
from kio.schema.metadata.v10.request import MetadataRequest

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.security.acl import AclBinding as ModelBinding
from onceflow.security.acl import AclError
from onceflow.security.acl import AclOperation as ModelOperation
from onceflow.security.acl_store import ACLS_FILE, AclStoreError, load_acls
from tests.admin_requests import call
from tests.security.brokers import authorizing, broker_with_users

PASSWORDS = {"admin": "admin-pw", "alice": "alice-pw", "bob": "bob-pw"}
USERS = {name: (password, ("SCRAM-SHA-256",)) for name, password in PASSWORDS.items()}
TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    data_dir = tmp_path_factory.mktemp("acls") / "data"
    with broker_with_users(
        data_dir,
        USERS,
        listeners="SASL_PLAINTEXT://127.0.0.1:0",
        settings={**authorizing("admin"), "group.initial.rebalance.delay.ms": "0"},
    ) as broker:
        yield broker


def client(broker: EmbeddedBroker, user: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": broker.bootstrap_for("SASL_PLAINTEXT"),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": user,
        "sasl.password": PASSWORDS[user],
        **extra,
    }


def admin(broker: EmbeddedBroker, user: str = "admin") -> AdminClient:
    return AdminClient(client(broker, user))


def name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(broker: EmbeddedBroker, topic: str) -> None:
    handle = admin(broker)  # kept alive until the answer: a destroyed handle fails its futures
    handle.create_topics([NewTopic(topic, 1)])[topic].result(TIMEOUT_S)


def allow(
    user: str,
    resource: ResourceType,
    resource_name: str,
    operation: AclOperation,
    pattern: ResourcePatternType = ResourcePatternType.LITERAL,
    permission: AclPermissionType = AclPermissionType.ALLOW,
) -> AclBinding:
    return AclBinding(resource, resource_name, pattern, f"User:{user}", "*", operation, permission)


def add_acls(broker: EmbeddedBroker, *bindings: AclBinding) -> None:
    handle = admin(broker)
    for future in handle.create_acls(list(bindings)).values():
        future.result(TIMEOUT_S)


def produce_error(broker: EmbeddedBroker, user: str, topic: str) -> int | None:
    """The error of one produced record (None if it was written)."""
    errors: list[Any] = []
    producer = Producer(client(broker, user, **{"message.timeout.ms": 10_000}))
    producer.produce(topic, b"v", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(TIMEOUT_S)
    assert len(errors) == 1
    return None if errors[0] is None else errors[0].code()


def first_consumer_error(consumer: Consumer) -> int:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is not None:
            return message.error().code()
    raise AssertionError("no error reached the consumer")


# -- the ACL APIs ---------------------------------------------------------------------------


def test_create_describe_delete_acls(acl_broker: EmbeddedBroker) -> None:
    topic = name("apis")
    bindings = [
        allow("alice", ResourceType.TOPIC, topic, AclOperation.READ),
        allow(
            "alice", ResourceType.TOPIC, topic[:5], AclOperation.WRITE, ResourcePatternType.PREFIXED
        ),
    ]
    add_acls(acl_broker, *bindings)
    client_admin = admin(acl_broker)
    match = AclBindingFilter(
        ResourceType.TOPIC, topic, ResourcePatternType.MATCH, None, None, AclOperation.ANY,
        AclPermissionType.ANY,
    )  # fmt: skip
    found = client_admin.describe_acls(match).result(TIMEOUT_S)
    assert set(found) >= set(bindings)
    literal = AclBindingFilter(
        ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, None, None, AclOperation.ANY,
        AclPermissionType.ANY,
    )  # fmt: skip
    deleted = client_admin.delete_acls([literal])[literal].result(TIMEOUT_S)
    assert deleted == [bindings[0]]
    assert bindings[0] not in client_admin.describe_acls(match).result(TIMEOUT_S)
    # alice may not manage ACLs: ALTER and DESCRIBE on the Cluster are needed.
    # (librdkafka's describe_acls drops DescribeAcls' top-level error: kafka-python reports it.)
    kafka_python = KafkaAdminClient(
        bootstrap_servers=acl_broker.bootstrap_for("SASL_PLAINTEXT"),
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username="alice",
        sasl_plain_password=PASSWORDS["alice"],
    )
    try:
        with pytest.raises(ClusterAuthorizationFailedError):
            kafka_python.describe_acls(
                ACLFilter(None, "*", ACLOperation.ANY, ACLPermissionType.ANY, ResourcePatternFilter(
                    KpResourceType.ANY, None, ACLResourcePatternType.ANY))
            )  # fmt: skip
    finally:
        kafka_python.close()
    alice = admin(acl_broker, "alice")
    futures = alice.create_acls([bindings[0]])
    with pytest.raises(KafkaException) as refused:
        futures[bindings[0]].result(TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


# -- an authenticated user without ACLs -----------------------------------------------------


def test_a_user_without_acls_gets_the_authorization_errors(acl_broker: EmbeddedBroker) -> None:
    topic = name("denied")
    create_topic(acl_broker, topic)
    assert produce_error(acl_broker, "bob", topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # Consume, in a group bob may use.
    group = name("g")
    add_acls(acl_broker, allow("bob", ResourceType.GROUP, group, AclOperation.READ))
    consumer = Consumer(client(acl_broker, "bob", **{"group.id": group}))
    consumer.subscribe([topic])
    try:
        assert first_consumer_error(consumer) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        consumer.close()
    # Describe: bob sees no topic, and is refused the configs.
    bob = admin(acl_broker, "bob")
    assert topic not in bob.list_topics(timeout=TIMEOUT_S).topics
    configs = bob.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    with pytest.raises(KafkaException) as refused:
        next(iter(configs.values())).result(TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # Create and delete topics.
    new = name("bobs")
    with pytest.raises(KafkaException) as refused:
        bob.create_topics([NewTopic(new, 1)])[new].result(TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as refused:
        bob.delete_topics([topic])[topic].result(TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert topic in admin(acl_broker).list_topics(timeout=TIMEOUT_S).topics  # synchronous
    # Transactional id.
    producer = Producer(client(acl_broker, "bob", **{"transactional.id": name("txn")}))
    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_group_join_and_commit_need_read_on_the_group(acl_broker: EmbeddedBroker) -> None:
    topic, group = name("grp"), name("g")
    create_topic(acl_broker, topic)
    # DESCRIBE on the group lets FindCoordinator through; JoinGroup and OffsetCommit need READ.
    add_acls(
        acl_broker,
        allow("bob", ResourceType.TOPIC, topic, AclOperation.READ),
        allow("bob", ResourceType.GROUP, group, AclOperation.DESCRIBE),
    )
    consumer = Consumer(client(acl_broker, "bob", **{"group.id": group}))
    consumer.subscribe([topic])
    try:
        assert first_consumer_error(consumer) == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        consumer.close()
    committer = Consumer(client(acl_broker, "bob", **{"group.id": group}))
    try:
        with pytest.raises(KafkaException) as refused:
            committer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
        assert refused.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        committer.close()


# -- with the right ACLs ----------------------------------------------------------------------


def test_exactly_once_path_with_prefixed_acls(acl_broker: EmbeddedBroker) -> None:
    """A consume-transform-produce with sendOffsetsToTransaction and a read_committed reader,
    each resource granted by one PREFIXED ACL."""
    prefix = name("eos") + "-"
    source, sink, group, txn = prefix + "in", prefix + "out", prefix + "group", prefix + "txn"
    for topic in (source, sink):
        create_topic(acl_broker, topic)
    pre = ResourcePatternType.PREFIXED
    add_acls(
        acl_broker,
        allow("alice", ResourceType.TOPIC, prefix, AclOperation.READ, pre),
        allow("alice", ResourceType.TOPIC, prefix, AclOperation.WRITE, pre),
        allow("alice", ResourceType.GROUP, prefix, AclOperation.READ, pre),
        allow("alice", ResourceType.TRANSACTIONAL_ID, prefix, AclOperation.WRITE, pre),
    )
    seed = Producer(client(acl_broker, "alice", **{"enable.idempotence": True}))
    for i in range(5):
        seed.produce(source, f"r{i}".encode())
    assert seed.flush(TIMEOUT_S) == 0
    consumer = Consumer(
        client(
            acl_broker, "alice",
            **{"group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
               "isolation.level": "read_committed"},
        )
    )  # fmt: skip
    consumer.subscribe([source])
    producer = Producer(client(acl_broker, "alice", **{"transactional.id": txn}))
    producer.init_transactions(TIMEOUT_S)
    got: list[Any] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < 5 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None:
            assert message.error() is None, message.error()
            got.append(message)
    assert len(got) == 5
    producer.begin_transaction()
    for message in got:
        producer.produce(sink, message.value().upper())
    producer.send_offsets_to_transaction(
        consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), TIMEOUT_S
    )
    producer.commit_transaction(TIMEOUT_S)
    consumer.close()
    reader = Consumer(
        client(
            acl_broker, "alice",
            **{"group.id": prefix + "reader", "auto.offset.reset": "earliest",
               "isolation.level": "read_committed"},
        )
    )  # fmt: skip
    reader.subscribe([sink])
    values = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(values) < 5 and time.monotonic() < deadline:
        message = reader.poll(0.5)
        if message is not None and message.error() is None:
            values.append(message.value())
    reader.close()
    assert values == [f"R{i}".encode() for i in range(5)]
    check = Consumer(client(acl_broker, "alice", **{"group.id": group}))
    try:
        offsets = check.committed([TopicPartition(source, 0)], timeout=TIMEOUT_S)
        assert offsets[0].offset == 5
    finally:
        check.close()


def test_deny_overrides_allow(acl_broker: EmbeddedBroker) -> None:
    topic = name("deny")
    create_topic(acl_broker, topic)
    add_acls(acl_broker, allow("alice", ResourceType.TOPIC, topic, AclOperation.ALL))
    assert produce_error(acl_broker, "alice", topic) is None
    add_acls(
        acl_broker,
        allow(
            "*", ResourceType.TOPIC, topic, AclOperation.WRITE, permission=AclPermissionType.DENY
        ),
    )
    assert produce_error(acl_broker, "alice", topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce_error(acl_broker, "admin", topic) is None  # a super user is never denied


def test_acls_survive_kill_9(tmp_path: Path) -> None:
    with broker_with_users(
        tmp_path / "data",
        USERS,
        listeners="SASL_PLAINTEXT://127.0.0.1:0",
        settings=authorizing("admin"),
        log_level="WARNING",
    ) as broker:
        topic = name("durable")
        create_topic(broker, topic)
        binding = allow("alice", ResourceType.TOPIC, topic, AclOperation.WRITE)
        add_acls(broker, binding)  # answered once on disk
        broker.restart()
        everything = AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
            AclPermissionType.ANY,
        )  # fmt: skip
        handle = admin(broker)
        assert handle.describe_acls(everything).result(TIMEOUT_S) == [binding]
        assert produce_error(broker, "alice", topic) is None


@pytest.mark.parametrize(
    ("content", "says"),
    [("{not json", "cannot read"), ("[1, 2]", "is damaged"), ('{"acls": [{"name": "t"}]}',
     "is damaged"), ('{"acls": [{"resource_type": "TOPIC", "name": "t", "pattern_type": "ANY",'
     ' "principal": "User:a", "host": "*", "operation": "READ", "permission_type": "ALLOW"}]}',
     "is damaged")],
)  # fmt: skip
def test_a_damaged_acl_file_is_one_line_for_the_operator(
    tmp_path: Path, content: str, says: str
) -> None:
    (tmp_path / ACLS_FILE).write_text(content)
    with pytest.raises(AclStoreError, match=says):
        load_acls(tmp_path)


def test_unknown_wire_codes_become_unknown_and_are_refused() -> None:
    binding = ModelBinding.from_codes(2, "t", 3, "User:a", "*", 99, 3)
    assert binding.entry.operation == ModelOperation.UNKNOWN
    with pytest.raises(AclError):
        binding.validate()


# -- authorized operations (Metadata v8+, DescribeGroups v3+) ---------------------------------


def test_authorized_operations_are_the_ones_the_acls_allow(acl_broker: EmbeddedBroker) -> None:
    topic, group = name("ops"), name("g")
    create_topic(acl_broker, topic)
    add_acls(
        acl_broker,
        allow("alice", ResourceType.TOPIC, topic, AclOperation.READ),
        allow("alice", ResourceType.GROUP, group, AclOperation.DELETE),
    )
    topics = TopicCollection([topic])
    alice, root = admin(acl_broker, "alice"), admin(acl_broker)
    described = alice.describe_topics(topics, include_authorized_operations=True)[topic]
    # READ implies DESCRIBE, as in Kafka.
    assert set(described.result(TIMEOUT_S).authorized_operations) == {
        AclOperation.READ, AclOperation.DESCRIBE,
    }  # fmt: skip
    everything = root.describe_topics(topics, include_authorized_operations=True)[topic]
    assert set(everything.result(TIMEOUT_S).authorized_operations) == {
        AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE,
        AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    }  # fmt: skip
    unasked = alice.describe_topics(topics)[topic].result(TIMEOUT_S)
    assert not unasked.authorized_operations
    groups = alice.describe_consumer_groups([group], include_authorized_operations=True)
    assert set(groups[group].result(TIMEOUT_S).authorized_operations) == {
        AclOperation.DELETE, AclOperation.DESCRIBE,
    }  # fmt: skip


def test_cluster_authorized_operations_in_metadata_v10(tmp_path: Path) -> None:
    """No super user, allow.everyone.if.no.acl.found: User:ANONYMOUS may do everything on the
    Cluster until an ACL names it, then only what the ACLs allow."""
    with EmbeddedBroker(
        tmp_path / "data",
        settings={**authorizing(None), "allow.everyone.if.no.acl.found": "true"},
    ) as broker:

        def cluster_operations(include: bool) -> int:
            request = MetadataRequest(
                topics=(),
                include_cluster_authorized_operations=include,
                include_topic_authorized_operations=False,
            )
            return int(call(broker.bootstrap, request).cluster_authorized_operations)

        supported = (
            AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
            AclOperation.DESCRIBE,
        )  # fmt: skip
        assert cluster_operations(True) == sum(1 << op.value for op in supported)
        assert cluster_operations(False) == -2147483648  # not asked for
        handle = AdminClient({"bootstrap.servers": broker.bootstrap})
        describe = allow("ANONYMOUS", ResourceType.BROKER, "kafka-cluster", AclOperation.DESCRIBE)
        handle.create_acls([describe])[describe].result(TIMEOUT_S)
        assert cluster_operations(True) == 1 << AclOperation.DESCRIBE.value
