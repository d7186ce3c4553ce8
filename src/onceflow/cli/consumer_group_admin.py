"""ConsumerGroupDescribe (KIP-848) at a group's coordinator, through `onceflow.protocol.client`:
the group epochs and the members' epochs and assignments, which confluent-kafka's admin client
does not report."""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from onceflow.cli.transaction_admin import connected
from onceflow.protocol.api_key import ApiKey
from onceflow.protocol.client import GROUP_KEY, UnsupportedApiError
from onceflow.protocol.entities import build
from onceflow.tools.clients import Cluster


@dataclass(frozen=True)
class ConsumerMember:
    member_id: str
    instance_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    assignment: dict[str, list[int]]
    target_assignment: dict[str, list[int]]
    # Kafka's MemberDescription.upgraded(): True for the consumer protocol, False for a classic
    # member of a consumer group (ConsumerGroupDescribe v1+ MemberType), None if not reported.
    upgraded: bool | None = None


@dataclass(frozen=True)
class ConsumerGroupInfo:
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[ConsumerMember, ...]


def _assignment(assignment: object) -> dict[str, list[int]]:
    return {
        tp.topic_name: sorted(tp.partitions) for tp in getattr(assignment, "topic_partitions", ())
    }


def _upgraded(member_type: int) -> bool | None:
    """MemberType: 0 classic, 1 consumer, -1 unknown (Kafka's MemberDescription.upgraded)."""
    return {0: False, 1: True}.get(member_type)


def describe_consumer_group(cluster: Cluster, group: str) -> ConsumerGroupInfo | None:
    """The group as a consumer group; None when it is a classic group (GROUP_ID_NOT_FOUND), or
    the broker does not offer ConsumerGroupDescribe."""
    with connected(cluster) as client:
        try:
            connection = client.coordinator_connection(group, GROUP_KEY)
            cls = connection.request_class(ApiKey.CONSUMER_GROUP_DESCRIBE)
        except UnsupportedApiError:
            return None
        response = connection.send(
            build(cls, group_ids=(group,), include_authorized_operations=False)
        )
    [described] = response.groups
    if described.error_code != ErrorCode.none:
        return None
    members = tuple(
        ConsumerMember(
            member_id=m.member_id,
            instance_id=m.instance_id,
            member_epoch=m.member_epoch,
            client_id=m.client_id,
            client_host=m.client_host,
            assignment=_assignment(m.assignment),
            target_assignment=_assignment(m.target_assignment),
            upgraded=_upgraded(getattr(m, "member_type", -1)),
        )
        for m in described.members
    )
    return ConsumerGroupInfo(
        group_id=described.group_id,
        state=described.group_state,
        group_epoch=described.group_epoch,
        assignment_epoch=described.assignment_epoch,
        assignor=described.assignor_name,
        members=members,
    )
