"""A coordinator on a ManualClock, and shortcuts to play clients against it."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.clock import ManualClock
from onceflow.groups.config import GroupCoordinatorConfig
from onceflow.groups.coordinator import (
    GroupCoordinator,
    JoinGroupRequest,
    JoinResult,
    SyncGroupRequest,
    SyncResult,
)

SESSION_MS = 10_000
REBALANCE_MS = 30_000
RANGE = (("range", b"range-meta"),)


@dataclass
class Reply:
    """Collects what a callback receives; a request must be answered at most once."""

    results: list[Any] = field(default_factory=list)

    def __call__(self, result: Any) -> None:
        assert not self.results, f"answered twice: {self.results[0]} then {result}"
        self.results.append(result)

    @property
    def done(self) -> bool:
        return bool(self.results)

    @property
    def result(self) -> Any:
        assert self.results, "not answered yet"
        return self.results[0]


class Env:
    def __init__(self, **config: int) -> None:
        config.setdefault("group_initial_rebalance_delay_ms", 0)
        self.clock = ManualClock()
        self.config = GroupCoordinatorConfig(**config)
        ids = itertools.count(1)
        self.coord = GroupCoordinator(
            self.clock, self.config, member_id_suffix=lambda: f"m{next(ids)}"
        )
        # Every record the coordinator asked to write, in log order, for restart tests.
        self.log: list[tuple[str, Any]] = []

    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        self.coord.tick()

    def join(
        self,
        member_id: str = "",
        *,
        group: str = "g",
        instance: str | None = None,
        protocols: Sequence[tuple[str, bytes]] = RANGE,
        protocol_type: str = "consumer",
        session: int = SESSION_MS,
        rebalance: int = REBALANCE_MS,
        require_known: bool = False,
        skip: bool = False,
        client_id: str = "client",
    ) -> Reply:
        reply = Reply()
        self.coord.join_group(
            JoinGroupRequest(
                group_id=group,
                member_id=member_id,
                protocol_type=protocol_type,
                protocols=protocols,
                session_timeout_ms=session,
                rebalance_timeout_ms=rebalance,
                group_instance_id=instance,
                client_id=client_id,
                require_known_member_id=require_known,
                supports_skip_assignment=skip,
            ),
            reply,
        )
        return reply

    def join_two(self) -> tuple[Any, Any]:
        """Two members join "g" and the join round completes: the leader's and the follower's
        JoinGroup answers (generation 1)."""
        a, b = self.join(), self.join()
        self.advance(1)
        return a.result, b.result

    def sync(
        self,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes] | None = None,
        *,
        group: str = "g",
        instance: str | None = None,
    ) -> Reply:
        reply = Reply()
        self.coord.sync_group(
            SyncGroupRequest(group, generation, member_id, instance, assignments=assignments or {}),
            reply,
        )
        return reply

    def heartbeat(
        self, member_id: str, generation: int, *, group: str = "g", instance: str | None = None
    ) -> ErrorCode:
        return self.coord.heartbeat(group, member_id, generation, instance)

    def form_group(
        self, n: int, *, group: str = "g", instances: Sequence[str | None] | None = None
    ) -> list[JoinResult]:
        """n members join a new group and sync; returns their join results (leader first)."""
        instances = list(instances) if instances is not None else [None] * n
        replies = [
            self.join(group=group, instance=instances[i], client_id=f"c{i}") for i in range(n)
        ]
        self.advance(1)  # the initial delay (0 here) fires on the next tick
        results = [r.result for r in replies]
        assert all(r.error is ErrorCode.none for r in results), results
        leader = next(r for r in results if r.leader == r.member_id)
        syncs = [
            self.sync(r.member_id, r.generation_id, group=group, instance=instances[i])
            for i, r in enumerate(results)
            if r is not leader
        ]
        assignments = {m.member_id: f"assigned:{m.member_id}".encode() for m in leader.members}
        leader_index = results.index(leader)
        syncs.append(
            self.sync(
                leader.member_id,
                leader.generation_id,
                assignments,
                group=group,
                instance=instances[leader_index],
            )
        )
        for s in syncs:
            sync_result: SyncResult = s.result
            assert sync_result.error is ErrorCode.none
        return [leader] + [r for r in results if r is not leader]

    def write(
        self,
        result_records: list[tuple[bytes, bytes | None]],
        *,
        producer_id: int = -1,
        transactional: bool = False,
    ) -> None:
        """What the broker does: append to the log, then replay."""
        for key, value in result_records:
            self.log.append(("record", (key, value, producer_id, transactional)))
            self.coord.replay(key, value, producer_id=producer_id, transactional=transactional)

    def marker(self, producer_id: int, committed: bool) -> None:
        self.log.append(("marker", (producer_id, committed)))
        self.coord.complete_transaction(producer_id, committed)


def replay_log(coord: GroupCoordinator, log: list[tuple[str, Any]]) -> None:
    for kind, entry in log:
        if kind == "record":
            key, value, producer_id, transactional = entry
            coord.replay(key, value, producer_id=producer_id, transactional=transactional)
        else:
            coord.complete_transaction(*entry)
