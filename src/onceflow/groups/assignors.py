"""The server-side assignors of KIP-848 consumer groups: ``uniform`` (the default) and ``range``.

An assignor maps each member to the partitions it should own (the group's target assignment),
from the members' subscriptions and the topics' partition counts. Both are pure functions.

- ``uniform`` (Kafka's UniformAssignor): partitions spread so that members' counts differ by at
  most one among the members subscribed to a topic, and sticky: a member keeps the partitions
  of its previous target assignment unless the balance needs one of them elsewhere, so a member
  joining or leaving moves only the partitions it must.
- ``range`` (Kafka's RangeAssignor): per topic, the subscribed members sorted by member id each
  get a contiguous range of partitions, the first ones one more when they do not divide evenly.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

TopicId = uuid.UUID
MemberAssignment = dict[TopicId, frozenset[int]]


@dataclass(frozen=True)
class AssignmentMember:
    """What an assignor knows of a member: its subscribed topics (resolved to ids) and its
    previous target assignment."""

    subscribed: frozenset[TopicId]
    previous: Mapping[TopicId, frozenset[int]] = field(default_factory=dict)


class Assignor:
    name: str = ""

    def assign(
        self, members: Mapping[str, AssignmentMember], partitions: Mapping[TopicId, int]
    ) -> dict[str, MemberAssignment]:
        raise NotImplementedError


def _freeze(owned: dict[str, dict[TopicId, set[int]]]) -> dict[str, MemberAssignment]:
    return {
        member_id: {t: frozenset(ps) for t, ps in topics.items() if ps}
        for member_id, topics in owned.items()
    }


class UniformAssignor(Assignor):
    name = "uniform"

    def assign(
        self, members: Mapping[str, AssignmentMember], partitions: Mapping[TopicId, int]
    ) -> dict[str, MemberAssignment]:
        owned: dict[str, dict[TopicId, set[int]]] = {m: {} for m in members}
        count = dict.fromkeys(members, 0)
        taken: set[tuple[TopicId, int]] = set()
        # 1. Stickiness: keep what each member had, where it is still subscribed and exists.
        for member_id in sorted(members):
            member = members[member_id]
            for topic_id, previous in member.previous.items():
                if topic_id not in member.subscribed or topic_id not in partitions:
                    continue
                for p in sorted(previous):
                    if p < partitions[topic_id] and (topic_id, p) not in taken:
                        owned[member_id].setdefault(topic_id, set()).add(p)
                        taken.add((topic_id, p))
                        count[member_id] += 1
        subscribers: dict[TopicId, list[str]] = {
            t: sorted(m for m in members if t in members[m].subscribed) for t in partitions
        }
        # 2. The partitions nobody holds go to the subscriber with the fewest.
        for topic_id in sorted(partitions, key=str):
            subs = subscribers[topic_id]
            if not subs:
                continue
            heap = [(count[m], m) for m in subs]
            heapq.heapify(heap)
            for p in range(partitions[topic_id]):
                if (topic_id, p) in taken:
                    continue
                n, target = heapq.heappop(heap)
                owned[target].setdefault(topic_id, set()).add(p)
                count[target] = n + 1
                heapq.heappush(heap, (n + 1, target))
        # 3. Balance: per topic, one partition at a time from its fullest owner to its
        # emptiest subscriber while they differ by more than one, so each member gives up
        # only what exceeds its share. Each move lowers the sum of squared counts: it ends.
        moved = True
        while moved:
            moved = False
            for topic_id in sorted(partitions, key=str):
                subs = subscribers[topic_id]
                while subs:
                    receiver = min(subs, key=lambda m: (count[m], m))
                    owners = [m for m in subs if owned[m].get(topic_id)]
                    if not owners:
                        break
                    donor = max(owners, key=lambda m: (count[m], m))
                    if count[receiver] >= count[donor] - 1:
                        break
                    p = max(owned[donor][topic_id])
                    owned[donor][topic_id].discard(p)
                    owned[receiver].setdefault(topic_id, set()).add(p)
                    count[donor] -= 1
                    count[receiver] += 1
                    moved = True
        return _freeze(owned)


class RangeAssignor(Assignor):
    name = "range"

    def assign(
        self, members: Mapping[str, AssignmentMember], partitions: Mapping[TopicId, int]
    ) -> dict[str, MemberAssignment]:
        owned: dict[str, dict[TopicId, set[int]]] = {m: {} for m in members}
        for topic_id, n in partitions.items():
            subscribed = sorted(m for m in members if topic_id in members[m].subscribed)
            if not subscribed:
                continue
            quota, extra = divmod(n, len(subscribed))
            start = 0
            for i, member_id in enumerate(subscribed):
                size = quota + (1 if i < extra else 0)
                if size:
                    owned[member_id][topic_id] = set(range(start, start + size))
                start += size
        return _freeze(owned)


ASSIGNORS: dict[str, Assignor] = {a.name: a for a in (UniformAssignor(), RangeAssignor())}
# group.consumer.assignors: the first is the default.
DEFAULT_ASSIGNOR = "uniform"
