"""DeleteRecords (21): move partitions' log start offsets forward (kafka-delete-records,
AdminClient.deleteRecords), as Kafka's Partition.deleteRecordsOnLeader decides it.

Per partition: DELETE on the topic (else TOPIC_AUTHORIZATION_FAILED), not an internal topic
(INVALID_TOPIC_EXCEPTION), a topic whose cleanup.policy includes delete (else
POLICY_VIOLATION), an offset from 0 to the high watermark, -1 meaning the high watermark (else
OFFSET_OUT_OF_RANGE). The answer's low watermark is the new log start offset, sent once it is
on disk; the segments wholly below it are deleted at the next retention check, as in Kafka.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers.context import DataContext
from onceflow.broker.handlers.responses import NO_THROTTLE, by_topic, response_classes
from onceflow.broker.storage_failure import halt_on_storage_error
from onceflow.log.errors import LogClosedError
from onceflow.protocol.entities import build
from onceflow.security import authorization as auth
from onceflow.txn.coordinator import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC

if TYPE_CHECKING:
    from onceflow.broker.partition import Partition
    from onceflow.protocol.messages import Request

log = logging.getLogger(__name__)

HIGH_WATERMARK = -1
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})


def handle_delete_records(ctx: DataContext, request: Request) -> Any:
    # Decided here, in arrival order, on the event loop; only the checkpoint's fsync waits.
    results: list[tuple[str, int, int, ErrorCode]] = []
    moved: list[Partition] = []
    for topic in request.body.topics:
        allowed = auth.authorize(request.session, auth.DELETE, auth.TOPIC, topic.name)
        for requested in topic.partitions:
            if not allowed:
                results.append((topic.name, requested.partition_index, -1, auth.failed(auth.TOPIC)))
                continue
            low, error = _delete_before(ctx, moved, topic.name, requested)
            results.append((topic.name, requested.partition_index, low, error))
    return _answer_when_stored(request, moved, results)


def _delete_before(
    ctx: DataContext, moved: list[Partition], topic: str, requested: Any
) -> tuple[int, ErrorCode]:
    if topic in INTERNAL_TOPICS:
        return -1, ErrorCode.invalid_topic_exception
    partition = ctx.topics.partition(topic, requested.partition_index)
    if partition is None:
        return -1, ErrorCode.unknown_topic_or_partition
    if not partition.config.delete:
        return -1, ErrorCode.policy_violation
    high_watermark = partition.high_watermark
    offset = high_watermark if requested.offset == HIGH_WATERMARK else requested.offset
    if not 0 <= offset <= high_watermark:
        return -1, ErrorCode.offset_out_of_range
    try:
        if partition.maybe_increment_log_start_offset(offset):
            log.info("log start offset of %s-%d moved to %d", topic, partition.index, offset)
        # Stored even when not moved now: an earlier request's write may still be under way.
        moved.append(partition)
    except LogClosedError:
        return -1, ErrorCode.unknown_topic_or_partition  # deleted meanwhile
    return partition.log_start_offset, ErrorCode.none


async def _answer_when_stored(
    request: Request, moved: list[Partition], results: list[tuple[str, int, int, ErrorCode]]
) -> Any:
    failed: dict[tuple[str, int], ErrorCode] = {}
    for partition in dict.fromkeys(moved):
        try:
            await asyncio.to_thread(partition.store_log_start_offset)
        except LogClosedError:
            failed[(partition.topic, partition.index)] = ErrorCode.unknown_topic_or_partition
        except OSError as e:
            halt_on_storage_error(e)
            log.error(
                "log start offset of %s-%d not stored: %s", partition.topic, partition.index, e
            )
            failed[(partition.topic, partition.index)] = ErrorCode.kafka_storage_error
    cls, topic_cls, partition_cls = response_classes(
        request, "DeleteRecordsTopicResult", "DeleteRecordsPartitionResult"
    )
    entries = []
    for topic, index, low, error in results:
        if error == ErrorCode.none and (topic, index) in failed:
            low, error = -1, failed[(topic, index)]
        entries.append(
            (
                topic,
                build(partition_cls, partition_index=index, low_watermark=low, error_code=error),
            )
        )
    return build(cls, throttle_time=NO_THROTTLE, topics=by_topic(entries, topic_cls))
