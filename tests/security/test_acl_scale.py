"""Many ACLs do not stall the broker (issue 19, item 4): with 10,000 ACLs and 500 topics, a
non-super user looping Metadata with authorized operations, from a broker just started (no
decision cached), leaves every other client served within 1 s throughout. The authorizer once
scanned every ACL for each of the request's 4,500 questions: 19.4 s on the event loop. The ACL
APIs over as many ACLs (DescribeAcls of all, DeleteAcls filters that read every ACL, CreateAcls
re-indexing them) leave other clients served too."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kio.schema.create_acls.v3.request import AclCreation, CreateAclsRequest
from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest
from kio.schema.delete_acls.v3.request import DeleteAclsFilter, DeleteAclsRequest
from kio.schema.describe_acls.v3.request import DescribeAclsRequest
from kio.schema.metadata.v10.request import MetadataRequest as AuthorizedOpsMetadataRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.static.primitive import i8

from onceflow.broker.data_dir import open_data_dir
from onceflow.broker.embedded import EmbeddedBroker
from onceflow.security.acl import (
    CLUSTER_NAME,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    PatternType,
    PermissionType,
    ResourcePattern,
    ResourceType,
)
from onceflow.security.acl_store import store_acls
from tests.security.brokers import authorizing
from tests.wire import WireClient

MakeBroker = Callable[..., EmbeddedBroker]
TOPICS = 500
OTHER_ACLS = 10_000
ATTACKS = 3
BOUND_S = 1.0  # the bound for other clients
WAIT_S = 300.0  # for an answer: the old code took 19.4 s per attack on a quiet machine
OPERATIONS = [AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.ALTER]
DELETE_FILTERS = 100
CREATIONS = 1_000
VICTIM_TOPIC = "load-victim"
ANONYMOUS = "User:ANONYMOUS"  # the principal of a PLAINTEXT connection: not a super user


def binding(
    resource_type: ResourceType,
    name: str,
    principal: str,
    operation: AclOperation,
    pattern: PatternType = PatternType.LITERAL,
    permission: PermissionType = PermissionType.ALLOW,
) -> AclBinding:
    return AclBinding(
        ResourcePattern(resource_type, name, pattern),
        AccessControlEntry(principal, "*", operation, permission),
    )


def many_acls() -> list[AclBinding]:
    """10,000 ACLs of other users on the topics (literal and prefixed, some DENY), and what
    ANONYMOUS needs: CREATE and DESCRIBE on the Cluster, DESCRIBE on every `load-` topic."""
    acls = [
        binding(
            ResourceType.TOPIC,
            f"load-{i % TOPICS}",
            f"User:user-{i}",
            OPERATIONS[i % len(OPERATIONS)],
            PatternType.PREFIXED if i % 4 == 0 else PatternType.LITERAL,
            PermissionType.DENY if i % 10 == 0 else PermissionType.ALLOW,
        )
        for i in range(OTHER_ACLS)
    ]
    return [
        *acls,
        binding(ResourceType.CLUSTER, CLUSTER_NAME, ANONYMOUS, AclOperation.CREATE),
        binding(ResourceType.CLUSTER, CLUSTER_NAME, ANONYMOUS, AclOperation.DESCRIBE),
        binding(
            ResourceType.TOPIC, "load-", ANONYMOUS, AclOperation.DESCRIBE, PatternType.PREFIXED
        ),
    ]


def create_topics(address: str, names: list[str]) -> set[int]:
    topics = tuple(
        CreatableTopic(
            name=name, num_partitions=1, replication_factor=-1, assignments=(), configs=()
        )
        for name in names
    )
    with WireClient(address, timeout=WAIT_S) as client:
        response = client.call(
            CreateTopicsRequest(
                topics=topics, timeout=datetime.timedelta(seconds=60), validate_only=False
            )
        )
    return {t.error_code for t in response.topics}


class Victim:
    """Another client: Metadata of its one topic on its own connection, again and again, each
    round trip timed (a timed-out one too); started, it has been served three times."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.request = MetadataRequest(
            topics=(MetadataRequestTopic(topic_id=None, name=topic),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        self.worst = 0.0
        self.rounds = 0
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with WireClient(self.bootstrap, timeout=WAIT_S) as client:
                while not self._stop.is_set():
                    started = time.monotonic()
                    try:
                        response = client.call(self.request)
                    finally:
                        self.worst = max(self.worst, time.monotonic() - started)
                    assert response.topics[0].error_code == 0, response.topics[0]
                    self.rounds += 1
                    time.sleep(0.01)  # a client's pace, not a busy loop
        except BaseException as e:  # reported by the test thread
            self.failures.append(e)

    def served(self, more: int = 3) -> None:
        """Wait until `more` further rounds were served (or a failure, or the deadline)."""
        target = self.rounds + more
        deadline = time.monotonic() + WAIT_S
        while self.rounds < target and not self.failures and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.rounds >= target, self.failures or "the other client was not served"

    def __enter__(self) -> Victim:
        self._thread.start()
        self.served()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)

    def figures(self) -> str:
        return f"the other client's worst round trip {self.worst:.3f} s over {self.rounds} rounds"


def broker_with_acls(make_broker: MakeBroker, data_dir: Path, super_user: str) -> EmbeddedBroker:
    """A broker whose first start replays many_acls() (as after a restart), with its topics."""
    open_data_dir(data_dir, node_id=0)
    store_acls(data_dir, many_acls())
    broker = make_broker(data_dir, settings=authorizing(super_user))
    names = [f"load-{i}" for i in range(TOPICS)]
    assert create_topics(broker.bootstrap, [*names, VICTIM_TOPIC]) == {0}
    return broker


def test_ten_thousand_acls_do_not_stall_other_clients(
    make_broker: MakeBroker, tmp_path: Path
) -> None:
    broker = broker_with_acls(make_broker, tmp_path / "data", "admin")
    attack = AuthorizedOpsMetadataRequest(
        topics=None,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=True,
        include_topic_authorized_operations=True,
    )
    attack_s: list[float] = []
    with Victim(broker.bootstrap, VICTIM_TOPIC) as victim:
        with WireClient(broker.bootstrap, timeout=WAIT_S) as attacker:
            for _ in range(ATTACKS):
                started = time.monotonic()
                response = attacker.call(attack)
                attack_s.append(time.monotonic() - started)
                # Every topic, each with DESCRIBE alone (its bit), as the ACLs say.
                assert len(response.topics) == TOPICS + 1
                assert {t.topic_authorized_operations for t in response.topics} == {
                    1 << AclOperation.DESCRIBE
                }
                cluster_operations = (1 << AclOperation.CREATE) | (1 << AclOperation.DESCRIBE)
                assert response.cluster_authorized_operations == cluster_operations
        victim.served()
    assert not victim.failures, victim.failures
    figures = (
        f"Metadata with authorized operations ({TOPICS + 1} topics, "
        f"{len(many_acls())} ACLs) took {', '.join(f'{s:.2f}' for s in attack_s)} s; "
        + victim.figures()
    )
    print(figures)
    assert victim.worst < BOUND_S, figures


ANY = i8(1)  # the wire code of ANY in every ACL enum


def test_the_acl_apis_over_ten_thousand_acls_do_not_stall_other_clients(
    make_broker: MakeBroker, tmp_path: Path
) -> None:
    """DescribeAcls of all of them, DeleteAcls with filters that name no resource nor principal
    (each reads every ACL), CreateAcls of 1,000 more: other clients are served meanwhile."""
    broker = broker_with_acls(make_broker, tmp_path / "data", "ANONYMOUS")
    total = len(many_acls())
    hosts = [f"10.9.{i // 256}.{i % 256}" for i in range(DELETE_FILTERS)]  # matching nothing
    delete = DeleteAclsRequest(
        filters=tuple(
            DeleteAclsFilter(
                resource_type_filter=ANY,
                resource_name_filter=None,
                pattern_type_filter=ANY,
                principal_filter=principal,
                host_filter=host,
                operation=ANY,
                permission_type=ANY,
            )
            for principal, host in [*((None, h) for h in hosts), ("User:user-1", None)]
        )
    )
    create = CreateAclsRequest(
        creations=tuple(
            AclCreation(
                resource_type=i8(ResourceType.GROUP),
                resource_name=f"group-{i}",
                resource_pattern_type=i8(PatternType.LITERAL),
                principal=f"User:user-{i}",
                host="*",
                operation=i8(AclOperation.READ),
                permission_type=i8(PermissionType.ALLOW),
            )
            for i in range(CREATIONS)
        )
    )
    took: dict[str, float] = {}
    with Victim(broker.bootstrap, VICTIM_TOPIC) as victim:
        with WireClient(broker.bootstrap, timeout=WAIT_S) as admin:
            started = time.monotonic()
            described = admin.call(
                DescribeAclsRequest(
                    resource_type_filter=ANY,
                    resource_name_filter=None,
                    pattern_type_filter=ANY,
                    principal_filter=None,
                    host_filter=None,
                    operation=ANY,
                    permission_type=ANY,
                )
            )
            took["DescribeAcls"] = time.monotonic() - started
            assert described.error_code == 0
            assert sum(len(r.acls) for r in described.resources) == total
            started = time.monotonic()
            deleted = admin.call(delete)
            took["DeleteAcls"] = time.monotonic() - started
            assert [len(r.matching_acls) for r in deleted.filter_results] == [0] * len(hosts) + [1]
            started = time.monotonic()
            created = admin.call(create)
            took["CreateAcls"] = time.monotonic() - started
            assert {r.error_code for r in created.results} == {0}
        victim.served()
    assert not victim.failures, victim.failures
    figures = (
        f"over {total} ACLs: "
        + ", ".join(f"{api} took {seconds:.2f} s" for api, seconds in took.items())
        + f" ({DELETE_FILTERS + 1} filters, {CREATIONS} creations); "
        + victim.figures()
    )
    print(figures)
    assert victim.worst < BOUND_S, figures
