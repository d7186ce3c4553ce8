"""ListOffsets (2): earliest, latest (high watermark or last stable offset), max timestamp,
and the first offset whose timestamp is at or after a given time."""

from __future__ import annotations

import dataclasses
import datetime
from collections import Counter
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers.context import DataContext
from onceflow.broker.handlers.metadata import LEADER_EPOCH
from onceflow.broker.handlers.responses import build_from, response_classes
from onceflow.broker.handlers.slices import Work, in_slices
from onceflow.log.offset_for_timestamp import SPECIAL_TIMESTAMPS
from onceflow.log.unified_log import FetchIsolation
from onceflow.protocol.entities import build
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.broker.topics import Partition
    from onceflow.protocol.messages import Request

READ_COMMITTED = 1


@dataclasses.dataclass(frozen=True)
class _Found:
    """One partition's answer, fields named as the response's."""

    error_code: ErrorCode = ErrorCode.none
    offset: int = -1
    timestamp: int = -1


def _find(partition: Partition | None, timestamp: int, read_committed: bool) -> _Found:
    if partition is None:
        return _Found(ErrorCode.unknown_topic_or_partition)
    if timestamp < 0 and timestamp not in SPECIAL_TIMESTAMPS:
        return _Found(ErrorCode.invalid_request)
    isolation = FetchIsolation.TXN_COMMITTED if read_committed else FetchIsolation.HIGH_WATERMARK
    offset, ts = partition.fetch_offset_by_timestamp(timestamp, isolation)
    return _Found(offset=offset, timestamp=ts)


def handle_list_offsets(ctx: DataContext, request: Request) -> Any:
    elements = sum(len(t.partitions) for t in request.body.topics)
    return in_slices(_list_offsets(ctx, request), elements)


def _list_offsets(ctx: DataContext, request: Request) -> Work:
    """One step per partition named. As Kafka's ReplicaManager.fetchOffset, a partition named
    more than once is answered once, with INVALID_REQUEST; a topic the principal may not
    describe gets TOPIC_AUTHORIZATION_FAILED for each partition as named."""
    req = request.body
    cls, topic_cls, part_cls = response_classes(
        request, "ListOffsetsTopicResponse", "ListOffsetsPartitionResponse"
    )
    read_committed = getattr(req, "isolation_level", 0) == READ_COMMITTED
    describable: dict[str, bool] = {}
    times_named: Counter[tuple[str, int]] = Counter()
    for t in req.topics:
        if t.name not in describable:
            describable[t.name] = auth.authorize(request.session, auth.DESCRIBE, auth.TOPIC, t.name)
        if describable[t.name]:
            for p in t.partitions:
                times_named[t.name, p.partition_index] += 1
                yield
    answers: dict[str, list[Any]] = {}
    answered: set[tuple[str, int]] = set()
    for t in req.topics:
        parts = answers.setdefault(t.name, [])
        for p in t.partitions:
            key = (t.name, p.partition_index)
            if not describable[t.name]:
                found = _Found(ErrorCode.topic_authorization_failed)
            elif key in answered:
                continue
            elif times_named[key] > 1:
                found = _Found(ErrorCode.invalid_request)
            else:
                partition = ctx.topics.partition(t.name, p.partition_index)
                found = _find(partition, p.timestamp, read_committed)
            answered.add(key)
            parts.append(
                build_from(
                    part_cls,
                    found,
                    partition_index=p.partition_index,
                    leader_epoch=LEADER_EPOCH,
                    old_style_offsets=(found.offset,),
                )
            )
            yield
    topics_out = tuple(
        build(topic_cls, name=name, partitions=tuple(parts)) for name, parts in answers.items()
    )
    return build(cls, throttle_time=datetime.timedelta(0), topics=topics_out)
