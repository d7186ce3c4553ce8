"""The two group models converted into each other for KIP-848's online upgrade and downgrade
(Kafka's ConsumerGroup.fromClassicGroup and ClassicGroup.fromConsumerGroup), as pure functions:
``consumer_groups.py`` decides when, writes the records and swaps the groups.
"""

from __future__ import annotations

import uuid

from onceflow.groups import consumer_protocol
from onceflow.groups.consumer_group import (
    Assignment,
    ConsumerGroup,
    ConsumerGroupMember,
    MemberState,
)
from onceflow.groups.consumer_messages import TopicsImage
from onceflow.groups.consumer_records import ClassicMemberMetadata
from onceflow.groups.group import CONSUMER_PROTOCOL_TYPE, ClassicGroup, GroupState, Member


def consumer_group_from_classic(classic: ClassicGroup, topics: TopicsImage) -> ConsumerGroup:
    """Each member keeps its subscription and last assignment (also its target), at member
    epoch = the generation, Stable; group and assignment epochs = the generation. Raises
    ConsumerProtocolError for subscription or assignment bytes that cannot be read."""
    generation = classic.generation_id
    group = ConsumerGroup(classic.group_id, group_epoch=generation, assignment_epoch=generation)
    protocol = classic.protocol_name
    if protocol is None and classic.members:
        # A new group in its first rebalance has chosen no protocol yet: the one it would.
        try:
            protocol = classic.select_protocol()
        except ValueError:
            protocol = None
    for cm in classic.members.values():
        subscription = consumer_protocol.decode_subscription(cm.metadata(protocol))
        assigned = topic_ids(consumer_protocol.decode_assignment(cm.assignment), topics)
        member = ConsumerGroupMember(
            cm.member_id,
            member_epoch=generation,
            previous_member_epoch=generation,
            state=MemberState.STABLE,
            instance_id=cm.group_instance_id,
            rack_id=subscription.rack_id,
            client_id=cm.client_id,
            client_host=cm.client_host,
            subscribed_topic_names=subscription.topics,
            rebalance_timeout_ms=cm.rebalance_timeout_ms,
            assigned=assigned,
            classic=ClassicMemberMetadata(
                cm.session_timeout_ms, tuple((n, bytes(m)) for n, m in cm.protocols)
            ),
        )
        group.put_member(member)
        group.target_assignment[member.member_id] = assigned
    return group


def classic_group_from_consumer(
    group: ConsumerGroup, leaving: str | None, topics: TopicsImage, now_ms: int
) -> tuple[ClassicGroup, dict[str, bytes]]:
    """The classic group of the classic members but ``leaving``: Stable at generation = the
    group epoch, the protocol they vote for, each member's target assignment as its
    ConsumerProtocolAssignment (in its subscription's version); and those assignments."""
    classic = ClassicGroup(
        group.group_id,
        created_ms=now_ms,
        state=GroupState.STABLE,
        generation_id=group.group_epoch,
        protocol_type=CONSUMER_PROTOCOL_TYPE,
    )
    for mid, m in group.members.items():
        if mid == leaving or m.classic is None:
            continue
        classic.add(
            Member(
                member_id=mid,
                group_instance_id=m.instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rebalance_timeout_ms=m.rebalance_timeout_ms,
                session_timeout_ms=m.classic.session_timeout_ms,
                protocol_type=CONSUMER_PROTOCOL_TYPE,
                protocols=list(m.classic.supported_protocols),
            )
        )
    classic.protocol_type = CONSUMER_PROTOCOL_TYPE
    classic.protocol_name = classic.select_protocol()
    assignment = {}
    for cm in classic.members.values():
        try:
            at_version = consumer_protocol.version(cm.metadata(classic.protocol_name))
        except consumer_protocol.ConsumerProtocolError:
            at_version = 0
        target = topic_names(group.target_assignment.get(cm.member_id, {}), topics)
        cm.assignment = consumer_protocol.encode_assignment(target, at_version)
        assignment[cm.member_id] = cm.assignment
    return classic, assignment


def common_protocol(members: list[ConsumerGroupMember]) -> bool:
    """The classic members share a protocol (the classic group needs one to select)."""
    names = [{n for n, _ in m.classic.supported_protocols} for m in members if m.classic]
    return bool(names) and bool(set.intersection(*names))


def topic_ids(by_name: dict[str, frozenset[int]], topics: TopicsImage) -> Assignment:
    """Partitions by topic id; topics that do not exist (any more) are left out, as Kafka."""
    out: dict[uuid.UUID, frozenset[int]] = {}
    for name, partitions in by_name.items():
        topic = topics.get(name)
        if topic is not None and partitions:
            out[topic.topic_id] = out.get(topic.topic_id, frozenset()) | partitions
    return out


def topic_names(by_id: Assignment, topics: TopicsImage) -> dict[str, frozenset[int]]:
    out: dict[str, frozenset[int]] = {}
    for topic_id, partitions in by_id.items():
        topic = topics.by_id(topic_id)
        if topic is not None and partitions:
            out[topic.name] = frozenset(partitions)
    return out


__all__ = [
    "classic_group_from_consumer",
    "common_protocol",
    "consumer_group_from_classic",
    "topic_ids",
    "topic_names",
]
