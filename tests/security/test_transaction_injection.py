"""No client writes into another producer's transaction (issue 19, item 2).

The victim is a confluent-kafka transactional producer with one record in its open
transaction. The attacker reads the victim's producer id, epoch and last sequence with
DescribeProducers and sends, over a raw connection, a transactional batch under them with the
next sequence. Kafka refuses it: with a null transactional id, TRANSACTIONAL_ID_AUTHORIZATION_FAILED
(KafkaApis.handleProduceRequest, with or without an authorizer); with a transactional id the
attacker may write but that does not own the producer id, INVALID_PRODUCER_ID_MAPPING; with
batches of two producers in one request, INVALID_PRODUCER_ID_MAPPING for the whole request.
Accepted, the injected record took the victim's next sequence (its next batch then failed with
OUT_OF_ORDER_SEQUENCE_NUMBER, fatal to the client) and its commit made the record committed
data. Afterwards the victim's next batch and its commit go through, and read_committed shows
only its own records.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from kio.schema.add_partitions_to_txn.v3.request import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnTopic,
)
from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.protocol.api_key import ApiKey
from onceflow.records.builder import build_batch
from tests.confluent import QUIET, Deliveries, create_topic
from tests.eos.checker import read_back, wait_settled
from tests.security.brokers import AUTHORIZER, broker_with_users
from tests.wire import WAIT, WireClient, produce_request

PASSWORDS = {"admin": "admin-pw", "alice": "alice-pw", "mallory": "mallory-pw"}
USERS = {name: (password, ("SCRAM-SHA-256",)) for name, password in PASSWORDS.items()}
PARTITIONS = 3


@dataclasses.dataclass
class Setup:
    """Where the victim and the attacker connect; `checks` is a listener with every right,
    for the test's own look at the partitions."""

    victim: dict[str, Any]  # the victim's client settings
    attacker: str  # address
    attacker_login: tuple[str, str] | None
    checks: str  # bootstrap
    victim_txn: str
    attacker_txn: str
    topic: str


class Attacker:
    """A raw connection that sends what no client library would."""

    def __init__(self, address: str, login: tuple[str, str] | None) -> None:
        self.wire = WireClient(address)
        if login is not None:
            user, password = login
            handshake = self.wire.request(ApiKey.SASL_HANDSHAKE, 1, mechanism="PLAIN")
            assert handshake.error_code == ErrorCode.none
            auth_bytes = f"\x00{user}\x00{password}".encode()
            answer = self.wire.request(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=auth_bytes)
            assert answer.error_code == ErrorCode.none, answer

    def close(self) -> None:
        self.wire.close()

    def open_producers(self, topic: str, partition: int) -> list[Any]:
        """DescribeProducers: the producers with a transaction open on the partition."""
        request = DescribeProducersRequest(
            topics=(TopicRequest(name=topic, partition_indexes=(partition,)),)
        )
        [part] = self.wire.call(request).topics[0].partitions
        assert part.error_code == ErrorCode.none, part
        return [p for p in part.active_producers if p.current_txn_start_offset >= 0]

    def produce(
        self, transactional_id: str | None, topic: str, parts: dict[int, bytes]
    ) -> dict[int, ErrorCode]:
        request = produce_request(topic, parts)
        request = dataclasses.replace(request, transactional_id=transactional_id)
        [answer] = self.wire.call(request).responses
        return {p.index: p.error_code for p in answer.partition_responses}

    def init_producer_id(self, transactional_id: str) -> tuple[int, int]:
        answer = self.wire.call(
            InitProducerIdRequest(
                transactional_id=transactional_id,
                transaction_timeout=datetime.timedelta(minutes=1),
                producer_id=-1,
                producer_epoch=-1,
            )
        )
        assert answer.error_code == ErrorCode.none, answer
        return answer.producer_id, answer.producer_epoch

    def end_txn(self, txn: str, pid: int, epoch: int) -> ErrorCode:
        """EndTxn: abort."""
        answer = self.wire.request(
            ApiKey.END_TXN,
            1,
            transactional_id=txn,
            producer_id=pid,
            producer_epoch=epoch,
            committed=False,
        )
        return ErrorCode(answer.error_code)

    def add_partition(self, txn: str, pid: int, epoch: int, topic: str, partition: int) -> None:
        answer = self.wire.call(
            AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=txn,
                v3_and_below_producer_id=pid,
                v3_and_below_producer_epoch=epoch,
                v3_and_below_topics=(AddPartitionsToTxnTopic(name=topic, partitions=(partition,)),),
            )
        )
        [topic_result] = answer.results_by_topic_v3_and_below
        assert [r.partition_error_code for r in topic_result.results_by_partition] == [
            ErrorCode.none
        ]


def forged(
    producer: Any, values: list[bytes], sequence: int | None = None, transactional: bool = True
) -> bytes:
    """A batch under `producer`'s id and epoch, by default transactional at its next sequence."""
    return build_batch(
        [(None, v, (), int(time.time() * 1000)) for v in values],
        producer_id=producer.producer_id,
        producer_epoch=producer.producer_epoch,
        base_sequence=producer.last_sequence + 1 if sequence is None else sequence,
        transactional=transactional,
    )


@dataclasses.dataclass(frozen=True)
class Own:
    producer_id: int
    producer_epoch: int
    last_sequence: int = -1


def attack(setup: Setup, with_own_transactional_id: bool) -> None:
    """Partition 0: into the victim's open transaction. Partition 1: ahead of the victim's
    first batch there. Partition 2: the attacker's own transaction."""
    topic = setup.topic
    victim = Producer(
        {**setup.victim, "transactional.id": setup.victim_txn, "linger.ms": 2, **QUIET}
    )
    victim.init_transactions(WAIT)
    victim.begin_transaction()
    deliveries = Deliveries()
    victim.produce(topic, b"victim-1", partition=0, on_delivery=deliveries)
    assert victim.flush(WAIT) == 0
    attacker = Attacker(setup.attacker, setup.attacker_login)
    try:
        [target] = attacker.open_producers(topic, 0)
        injected = forged(target, [b"injected"])
        # A null transactional id: KafkaApis refuses transactional records outright.
        answer = attacker.produce(None, topic, {0: injected})
        assert answer == {0: ErrorCode.transactional_id_authorization_failed}
        # Not transactional, where the victim will write next (stricter than Kafka, which
        # takes it as an idempotent batch: the victim's first batch there would be refused).
        ahead = forged(target, [b"injected"], sequence=0, transactional=False)
        assert attacker.produce(None, topic, {1: ahead}) == {1: ErrorCode.invalid_txn_state}
        if with_own_transactional_id:
            # One the attacker may write, and its own producer: the producer id is not its.
            own_pid, own_epoch = attacker.init_producer_id(setup.attacker_txn)
            answer = attacker.produce(setup.attacker_txn, topic, {0: injected})
            assert answer == {0: ErrorCode.invalid_producer_id_mapping}
            # Its own batch beside the forged one: one producer per request, or nothing.
            attacker.add_partition(setup.attacker_txn, own_pid, own_epoch, topic, 2)
            own = forged(Own(own_pid, own_epoch), [b"attacker-own"])
            answer = attacker.produce(setup.attacker_txn, topic, {0: injected, 2: own})
            assert answer == {
                0: ErrorCode.invalid_producer_id_mapping,
                2: ErrorCode.invalid_producer_id_mapping,
            }
            # Alone, its own batch in its own transaction is fine.
            assert attacker.produce(setup.attacker_txn, topic, {2: own}) == {2: ErrorCode.none}
            assert attacker.end_txn(setup.attacker_txn, own_pid, own_epoch) == ErrorCode.none
    finally:
        attacker.close()

    # The victim's next batches keep their sequences, and its commit is its records only.
    victim.produce(topic, b"victim-2", partition=0, on_delivery=deliveries)
    victim.produce(topic, b"victim-3", partition=1, on_delivery=deliveries)
    assert victim.flush(WAIT) == 0
    assert deliveries.failed == []
    victim.commit_transaction(WAIT)
    tps = [(topic, 0), (topic, 1)]
    wait_settled(setup.checks, tps)
    read = read_back(setup.checks, tps)
    expected = {(topic, 0): [b"victim-1", b"victim-2"], (topic, 1): [b"victim-3"]}
    assert {tp: r.committed for tp, r in read.items()} == expected
    assert {tp: r.uncommitted for tp, r in read.items()} == expected


# -- without security ----------------------------------------------------------------------


def test_no_transaction_injection_without_security(bootstrap: str) -> None:
    topic = f"inject-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    setup = Setup(
        victim={"bootstrap.servers": bootstrap},
        attacker=bootstrap,
        attacker_login=None,
        checks=bootstrap,
        victim_txn=f"victim-{topic}",
        attacker_txn=f"attacker-{topic}",
        topic=topic,
    )
    attack(setup, with_own_transactional_id=True)


# -- with an authorizer --------------------------------------------------------------------


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """SASL for the victim and the attacker; PLAINTEXT (User:ANONYMOUS, a super user here) for
    the test's own checks, which use clients without SASL."""
    data_dir = tmp_path_factory.mktemp("inject") / "data"
    settings = {
        "authorizer.class.name": AUTHORIZER,
        "super.users": "User:admin;User:ANONYMOUS",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
    }
    listeners = "SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0"
    with broker_with_users(data_dir, USERS, listeners=listeners, settings=settings) as broker:
        yield broker


def _client(broker: EmbeddedBroker, user: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": broker.bootstrap_for("SASL_PLAINTEXT"),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": user,
        "sasl.password": PASSWORDS[user],
    }


def _allow(user: str, resource: ResourceType, name: str, operation: AclOperation) -> AclBinding:
    return AclBinding(
        resource,
        name,
        ResourcePatternType.LITERAL,
        f"User:{user}",
        "*",
        operation,
        AclPermissionType.ALLOW,
    )


@pytest.mark.parametrize("attacker_has_a_transactional_id", [False, True])
def test_no_transaction_injection_with_acls(
    acl_broker: EmbeddedBroker, attacker_has_a_transactional_id: bool
) -> None:
    topic = f"inject-{uuid.uuid4().hex[:8]}"
    checks = acl_broker.bootstrap_for("PLAINTEXT")
    create_topic(checks, topic, PARTITIONS)
    victim_txn, attacker_txn = f"alice-{topic}", f"mallory-{topic}"
    # The victim: a producer's ACLs. The attacker: Read and Write on the topic only, and
    # Write on a transactional id of its own in the second case.
    bindings = [
        _allow("alice", ResourceType.TOPIC, topic, AclOperation.WRITE),
        _allow("alice", ResourceType.TRANSACTIONAL_ID, victim_txn, AclOperation.WRITE),
        _allow("mallory", ResourceType.TOPIC, topic, AclOperation.READ),
        _allow("mallory", ResourceType.TOPIC, topic, AclOperation.WRITE),
    ]
    if attacker_has_a_transactional_id:
        bindings.append(
            _allow("mallory", ResourceType.TRANSACTIONAL_ID, attacker_txn, AclOperation.WRITE)
        )
    admin = AdminClient({"bootstrap.servers": checks, **QUIET})
    for future in admin.create_acls(bindings).values():
        future.result(WAIT)
    setup = Setup(
        victim=_client(acl_broker, "alice"),
        attacker=acl_broker.bootstrap_for("SASL_PLAINTEXT"),
        attacker_login=("mallory", PASSWORDS["mallory"]),
        checks=checks,
        victim_txn=victim_txn,
        attacker_txn=attacker_txn,
        topic=topic,
    )
    attack(setup, with_own_transactional_id=attacker_has_a_transactional_id)
