"""Consumer-group offset translation (MirrorMaker 2's MirrorCheckpointTask with
`sync.group.offsets.enabled`), exact: run by the mirror's driver every
--sync-group-offsets-interval.

For each source group matching --groups, its committed offsets on mirrored topics are
translated through the offset syncs (onceflow.mirror.offset_syncs) and committed to the same
group id on the target, under the target topic names, so an application failing over from
source to target resumes where it stood, skipping and repeating nothing. As MM2 does, a group is
moved only while it has no members on the target (Empty, or Dead: unknown there) and only
forward: a group that has consumed further on the target is not rewound. An offset the syncs
do not cover (beyond what is mirrored) is not committed until they do. Each translation is
also recorded as an MM2 checkpoint in `{alias}.checkpoints.internal`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from confluent_kafka import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from onceflow.librdkafka_log import QUIET
from onceflow.mirror.checkpoints import Checkpoint, checkpoints_topic
from onceflow.mirror.offset_sync_store import OffsetSyncStore
from onceflow.mirror.offset_syncs import offset_syncs_topic
from onceflow.mirror.replication_policy import ReplicationPolicy
from onceflow.mirror.topic_sync import ensure_internal_topic

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# MirrorMaker 2's default groups.exclude: tools' and Connect's groups, internal ones
EXCLUDED_GROUPS = re.compile(r"console-consumer-.*|connect-.*|__.*")
# states in which a group has no members that could be consuming the target's copy
_IDLE = frozenset({ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD, ConsumerGroupState.UNKNOWN})

TargetPartition = tuple[str, int]


class GroupSyncError(RuntimeError):
    """A cluster did not answer a group request (the next interval tries again)."""


class GroupsPatternError(ValueError):
    """A --groups that is not a regex."""


def groups_pattern(groups: str) -> re.Pattern[str]:
    """--groups as a regex matched whole, as --topics."""
    try:
        return re.compile(groups)
    except re.error as exc:
        raise GroupsPatternError(f"--groups {groups!r} is not a regex: {exc}") from exc


@dataclass(frozen=True)
class Translation:
    source_offset: int
    target_offset: int
    metadata: str


@dataclass
class GroupSyncReport:
    """What one pass did, per group: partitions moved (target partition: translation), and
    why a group or some of its partitions stayed."""

    moved: dict[str, dict[TargetPartition, Translation]] = field(default_factory=dict)
    held: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        parts = []
        for group, moves in sorted(self.moved.items()):
            shown = ", ".join(
                f"{t}/{p} {m.source_offset}->{m.target_offset}"
                for (t, p), m in sorted(moves.items())
            )
            parts.append(f"{group}: {shown}")
        parts += [f"{group}: {why}" for group, why in sorted(self.held.items())]
        return "mirror: groups: " + ("; ".join(parts) or "nothing to move")


class GroupSync:
    """The driver's group translation; sync() is one pass."""

    def __init__(
        self,
        *,
        source_client: dict[str, str],
        target_client: dict[str, str],
        policy: ReplicationPolicy,
        topics: str,
        groups: str,
        timeout_s: float = 30.0,
    ) -> None:
        self.policy = policy
        self.topics = re.compile(topics)
        self.groups = groups_pattern(groups)
        self.timeout_s = timeout_s
        self.source = AdminClient({**source_client, "logger": QUIET})
        self.target = AdminClient({**target_client, "logger": QUIET})
        self.target_client = target_client
        self.store = OffsetSyncStore(target_client, offset_syncs_topic(policy.alias), timeout_s)
        self._checkpoints: Producer | None = None
        self._checkpointed: dict[tuple[str, TargetPartition], Translation] = {}

    def _result(self, what: str, future: Future, reader: Callable[[object], _T]) -> _T:
        try:
            return reader(future.result(timeout=self.timeout_s))
        except (KafkaException, TimeoutError) as exc:
            raise GroupSyncError(f"{what}: {exc}") from exc

    def sync(self) -> GroupSyncReport:
        """Translate and commit every matching group's offsets (raises GroupSyncError when a
        cluster does not answer; what was committed before stays, and is never wrong)."""
        self.store.refresh()
        report = GroupSyncReport()
        for group in self.source_groups():
            translated, beyond = self.translate(group)
            if translated:
                self.checkpoint(group, translated)
                self.commit_forward(group, translated, report)
            if beyond:
                held = report.held.get(group)
                note = f"{beyond} partitions not mirrored that far yet"
                report.held[group] = f"{held}, {note}" if held else note
        if self._checkpoints is not None:
            self._checkpoints.flush(self.timeout_s)
        return report

    def source_groups(self) -> list[str]:
        listing = self._result(
            "listing the source's groups",
            self.source.list_consumer_groups(request_timeout=self.timeout_s),
            lambda r: r.valid,  # type: ignore[attr-defined]
        )
        names = {g.group_id for g in listing}
        return sorted(
            g for g in names if self.groups.fullmatch(g) and not EXCLUDED_GROUPS.fullmatch(g)
        )

    def translate(self, group: str) -> tuple[dict[TargetPartition, Translation], int]:
        """The group's source offsets of mirrored topics, translated; and how many were not
        translatable yet."""
        offsets = self._offsets(self.source, "source", ConsumerGroupTopicPartitions(group))
        translated: dict[TargetPartition, Translation] = {}
        beyond = 0
        for tp in offsets:
            if tp.offset < 0 or not self.topics.fullmatch(tp.topic):
                continue
            target = (self.policy.target_topic(tp.topic), tp.partition)
            offset = self.store.index.translate(*target, tp.offset)
            if offset is None:
                beyond += 1
            else:
                translated[target] = Translation(tp.offset, offset, tp.metadata or "")
        return translated, beyond

    def _offsets(
        self, admin: AdminClient, side: str, request: ConsumerGroupTopicPartitions
    ) -> list[TopicPartition]:
        futures = admin.list_consumer_group_offsets([request], request_timeout=self.timeout_s)
        answer = self._result(
            f"offsets of group {request.group_id} on the {side}",
            futures[request.group_id],
            lambda r: r.topic_partitions or [],  # type: ignore[attr-defined]
        )
        for tp in answer:
            if tp.error is not None and tp.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise GroupSyncError(f"{request.group_id} {tp.topic}/{tp.partition}: {tp.error}")
        return [tp for tp in answer if tp.error is None]

    def commit_forward(
        self, group: str, translated: dict[TargetPartition, Translation], report: GroupSyncReport
    ) -> None:
        """Commit on the target what moves the group forward, if it has no members there."""
        future = self.target.describe_consumer_groups([group], request_timeout=self.timeout_s)
        state = self._result(
            f"describing group {group} on the target",
            future[group],
            lambda d: d.state,  # type: ignore[attr-defined]
        )
        if state not in _IDLE:
            report.held[group] = f"active on the target ({state.name}), not moved"
            return
        request = ConsumerGroupTopicPartitions(
            group, [TopicPartition(t, p) for t, p in sorted(translated)]
        )
        current = {
            (tp.topic, tp.partition): tp.offset
            for tp in self._offsets(self.target, "target", request)
        }
        forward = {tp: t for tp, t in translated.items() if t.target_offset > current.get(tp, -1)}
        ahead = sum(1 for tp, t in translated.items() if current.get(tp, -1) > t.target_offset)
        if ahead:
            report.held[group] = f"{ahead} partitions ahead on the target, not rewound"
        if not forward:
            return
        commit = ConsumerGroupTopicPartitions(
            group,
            [TopicPartition(t, p, m.target_offset, m.metadata) for (t, p), m in forward.items()],
        )
        futures = self.target.alter_consumer_group_offsets([commit], request_timeout=self.timeout_s)
        try:
            answer = futures[group].result(timeout=self.timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.UNKNOWN_MEMBER_ID:
                # a member joined since the describe: Kafka refuses, as it should
                report.held[group] = "a member joined on the target, not moved"
                return
            raise GroupSyncError(f"committing group {group} on the target: {exc}") from exc
        failed = [tp for tp in answer.topic_partitions or [] if tp.error is not None]
        if failed:
            raise GroupSyncError(f"committing group {group} on the target: {failed[0].error}")
        report.moved[group] = forward
        log.info("group %s moved on the target: %s", group, forward)

    def checkpoint(self, group: str, translated: dict[TargetPartition, Translation]) -> None:
        """MM2's checkpoint records of the translations that changed."""
        if self._checkpoints is None:
            topic = checkpoints_topic(self.policy.alias)
            ensure_internal_topic(self.target, topic, {"cleanup.policy": "compact"}, self.timeout_s)
            self._checkpoints = Producer(
                {
                    **self.target_client,
                    "enable.idempotence": True,
                    "on_delivery": self._checkpoint_delivered,
                    "logger": QUIET,
                }
            )
        for (topic, partition), t in translated.items():
            if self._checkpointed.get((group, (topic, partition))) == t:
                continue
            record = Checkpoint(
                group, topic, partition, t.source_offset, t.target_offset, t.metadata
            )
            self._checkpoints.produce(
                checkpoints_topic(self.policy.alias), record.value(), record.key(), partition=0
            )
            self._checkpointed[(group, (topic, partition))] = t

    def _checkpoint_delivered(self, error: KafkaError | None, message: Any) -> None:
        if error is not None:
            # said, and written again at the next pass (the commits do not depend on it)
            checkpoint = Checkpoint.decode(message.key(), message.value())
            self._checkpointed.pop(
                (checkpoint.group, (checkpoint.topic, checkpoint.partition)), None
            )
            log.warning("checkpoint %s not written: %s", checkpoint, error)

    def close(self) -> None:
        self.store.close()
        if self._checkpoints is not None:
            self._checkpoints.flush(self.timeout_s)
