"""ListGroups and DescribeGroups: read-only views of the classic groups."""

from __future__ import annotations

from collections.abc import Iterable

from kio.schema.errors import ErrorCode

from onceflow.groups.group import ClassicGroup, GroupState
from onceflow.groups.messages import (
    GROUP_TYPE_CLASSIC,
    GroupDescription,
    GroupListing,
    MemberDescription,
)


def list_groups(
    groups: Iterable[ClassicGroup],
    states: Iterable[str] | None = None,
    types: Iterable[str] | None = None,
) -> list[GroupListing]:
    """Groups, filtered by state names and group types (case-insensitive; empty = all).

    All groups here are classic groups, whatever their protocol type ("consumer", "connect",
    ...).
    """
    state_filter = {s.lower() for s in states or ()}
    type_filter = {t.lower() for t in types or ()}
    if type_filter and GROUP_TYPE_CLASSIC not in type_filter:
        return []
    return [
        GroupListing(g.group_id, g.protocol_type or "", g.state.value)
        for g in groups
        if not state_filter or g.state.value.lower() in state_filter
    ]


def describe_group(group_id: str, group: ClassicGroup | None) -> GroupDescription:
    """One DescribeGroups entry; members' metadata and assignments only for a Stable group."""
    if group is None or group.is_in(GroupState.DEAD):
        return GroupDescription(group_id, ErrorCode.group_id_not_found, GroupState.DEAD.value)
    stable = group.is_in(GroupState.STABLE)
    members = tuple(
        MemberDescription(
            m.member_id,
            m.group_instance_id,
            m.client_id,
            m.client_host,
            m.metadata(group.protocol_name) if stable else b"",
            m.assignment if stable else b"",
        )
        for m in group.members.values()
    )
    return GroupDescription(
        group_id,
        ErrorCode.none,
        group.state.value,
        protocol_type=group.protocol_type or "",
        protocol_data=(group.protocol_name or "") if stable else "",
        members=members,
    )
