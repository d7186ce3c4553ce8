"""The group timers: which deadlines of the classic groups are set, and which are due.

Each group has at most one join deadline (the rebalance), one sync deadline (members that must
send SyncGroup), one per pending member id (KIP-394) and one session deadline per member. They
are plain fields of the group and its members; this module lists them so that the coordinator
can fire the due ones in a fixed order (time, then kind, then group and member ids), which
keeps a simulation replayable.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from onceflow.groups.group import ClassicGroup


class TimerKind(enum.IntEnum):
    # The order breaks ties between deadlines of the same millisecond.
    JOIN = 0
    SYNC = 1
    PENDING_MEMBER = 2
    HEARTBEAT = 3


class Deadline(NamedTuple):
    at_ms: int
    kind: TimerKind
    group_id: str
    member_id: str = ""


def group_deadlines(group: ClassicGroup) -> Iterator[Deadline]:
    """Every deadline set on the group and its members."""
    gid = group.group_id
    if group.join_deadline_ms is not None:
        yield Deadline(group.join_deadline_ms, TimerKind.JOIN, gid)
    if group.sync_deadline_ms is not None:
        yield Deadline(group.sync_deadline_ms, TimerKind.SYNC, gid)
    for member_id, at_ms in group.pending_join_members.items():
        yield Deadline(at_ms, TimerKind.PENDING_MEMBER, gid, member_id)
    for member in group.members.values():
        if member.heartbeat_deadline_ms is not None:
            yield Deadline(member.heartbeat_deadline_ms, TimerKind.HEARTBEAT, gid, member.member_id)


def next_deadline(groups: Iterable[ClassicGroup]) -> int | None:
    """The earliest deadline (ms) of any group, if any."""
    return min((d.at_ms for g in groups for d in group_deadlines(g)), default=None)


def due_deadlines(groups: Iterable[ClassicGroup], now_ms: int) -> list[Deadline]:
    """The deadlines that have passed, earliest first."""
    return sorted(d for g in groups for d in group_deadlines(g) if d.at_ms <= now_ms)


def still_set(group: ClassicGroup, deadline: Deadline) -> bool:
    """Firing an earlier deadline may have moved or cleared this one: then it must not fire."""
    return deadline in group_deadlines(group)
