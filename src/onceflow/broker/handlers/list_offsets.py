"""ListOffsets (2): earliest, latest (high watermark or last stable offset), max timestamp,
and the first offset whose timestamp is at or after a given time."""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers.context import DataContext
from onceflow.broker.handlers.metadata import LEADER_EPOCH
from onceflow.broker.handlers.responses import build_from, response_classes
from onceflow.broker.handlers.slices import Work, in_slices
from onceflow.protocol.entities import build
from onceflow.records.batch import check_batch, parse_header
from onceflow.records.errors import RecordsError
from onceflow.records.walker import walk_batch
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.broker.topics import Partition
    from onceflow.protocol.messages import Request

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
READ_COMMITTED = 1

log = logging.getLogger(__name__)


def offset_for_time(partition: Partition, timestamp: int, upper: int) -> tuple[int, int]:
    """(offset, timestamp) of the first record at or after `timestamp` below `upper`,
    or (-1, -1) when there is none."""
    found = partition.log.offset_for_timestamp(timestamp)
    if found is None or found[0] >= upper:
        return -1, -1
    # The first batch whose max timestamp reaches the target holds the record we want; its
    # records are walked as a stream up to the first match, never decompressed whole.
    match = _first_record_at(partition, found[0], timestamp, upper)
    return match if match is not None else (-1, -1)


def max_timestamp_offset(partition: Partition, upper: int) -> tuple[int, int]:
    """(offset, timestamp) of the record with the largest timestamp, when it is below `upper`
    ((-1, -1) otherwise), as Kafka answers MAX_TIMESTAMP: the segment with the largest max
    timestamp, then the one batch that holds it (a control batch too, as in Kafka), then its
    first record with that timestamp."""
    found = partition.log.max_timestamp_and_offset()
    if found is None:
        return -1, -1
    timestamp, last_offset = found
    if last_offset >= upper:
        # Kafka answers no offset while the record with the largest timestamp is not readable
        # yet (above the high watermark, or the last stable offset for read_committed); it does
        # not look for the largest timestamp below it.
        return -1, -1
    if last_offset < partition.log.log_start_offset:
        return _scan_max_timestamp(partition, upper)
    match = _first_record_at(partition, last_offset, timestamp, upper)
    return match if match is not None else (-1, -1)


def _first_record_at(
    partition: Partition, offset: int, timestamp: int, upper: int
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record at or after `timestamp` in the batch holding
    `offset`; the batch's own (base offset, max timestamp) if it cannot be walked."""
    data = partition.log.read(offset, 1, max_offset=upper).data
    if not data:
        return None
    try:
        header = check_batch(data, verify_crc=False)
        summary = walk_batch(data, 0, header, target_timestamp=timestamp, check_timestamps=False)
    except RecordsError as e:
        # Stored before Produce walked every record (or damaged on disk): answer the batch,
        # which holds the target by its max timestamp, rather than fail the request.
        log.warning("ListOffsets cannot walk the batch holding offset %d: %s", offset, e)
        header = parse_header(data)
        return header.base_offset, header.max_timestamp
    if summary.found is None:
        return None
    delta, ts = summary.found
    return header.base_offset + delta, ts


def _scan_max_timestamp(partition: Partition, upper: int) -> tuple[int, int]:
    best = (-1, -1)
    for header in partition.log.iter_batch_headers(partition.log.log_start_offset):
        if header.base_offset >= upper:
            break
        if header.max_timestamp > best[1]:
            best = (header.base_offset, header.max_timestamp)
    if best[0] < 0:
        return best
    match = _first_record_at(partition, best[0], best[1], upper)
    return match if match is not None else best


@dataclasses.dataclass(frozen=True)
class _Found:
    """One partition's answer, fields named as the response's."""

    error_code: ErrorCode = ErrorCode.none
    offset: int = -1
    timestamp: int = -1


def _find(partition: Partition | None, timestamp: int, read_committed: bool) -> _Found:
    if partition is None:
        return _Found(ErrorCode.unknown_topic_or_partition)
    upper = partition.last_stable_offset if read_committed else partition.high_watermark
    if timestamp in (LATEST, LATEST_TIERED):
        return _Found(offset=upper)
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return _Found(offset=partition.log.log_start_offset)
    if timestamp == MAX_TIMESTAMP:
        offset, ts = max_timestamp_offset(partition, upper)
    elif timestamp < 0:
        return _Found(ErrorCode.invalid_request)
    else:
        offset, ts = offset_for_time(partition, timestamp, upper)
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
