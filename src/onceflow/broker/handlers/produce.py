"""Produce (0): validate batches, append them as sent, acknowledge per `acks`.

Every record of every batch is walked before the append (records/validation.py), compressed
batches as a stream of at most `message.max.decompressed.bytes` decompressed bytes, so nothing
undecodable, and no decompression bomb, is ever stored.

acks=-1 answers only after the appended bytes are fsynced (group commit); acks=0/1 answer at
once, and their data is made durable by the next round of fsyncs, which also moves the high
watermark (so readers only ever see durable data).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.append_outcome import AppendRefused
from onceflow.broker.dispatch import api
from onceflow.broker.durability import PartitionsNotDurableError
from onceflow.broker.faults import crash_point, delay_point
from onceflow.protocol.entities import build, has_field, sibling
from onceflow.protocol.messages import response_type
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.broker.partition import Partition
    from onceflow.broker.server import Broker
    from onceflow.protocol.messages import Request

log = logging.getLogger(__name__)


def to_datetime(ms: int) -> datetime.datetime | None:
    if ms < 0:
        return None
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


@api(0, 0, 12, parsed_from=3)
def handle_produce(broker: Broker, request: Request) -> Any:
    req = request.body
    cls = response_type(0, request.api_version)
    topic_cls = sibling(cls, "TopicProduceResponse")
    part_cls = sibling(cls, "PartitionProduceResponse")
    # Produce v8+ names the records at fault (KIP-467)
    record_error_cls = (
        sibling(cls, "BatchIndexAndErrorMessage") if has_field(part_cls, "record_errors") else None
    )
    if req.acks not in (0, 1, -1):
        error_all: ErrorCode | None = ErrorCode.invalid_required_acks
    elif req.transactional_id is not None and not auth.authorize(
        request.session, auth.WRITE, auth.TRANSACTIONAL_ID, req.transactional_id
    ):
        error_all = ErrorCode.transactional_id_authorization_failed
    else:
        error_all = None
    touched: list[Partition] = []
    topics_out = []
    for topic_data in req.topic_data:
        writable = auth.authorize(request.session, auth.WRITE, auth.TOPIC, topic_data.name)
        parts_out = []
        for pdata in topic_data.partition_data:
            partition = broker.topics.partition(topic_data.name, pdata.index)
            base_offset, append_time, start = -1, -1, -1
            error, message = ErrorCode.none, None
            record_errors: tuple[Any, ...] = ()
            if error_all is not None:
                error = error_all
            elif not writable:
                error = ErrorCode.topic_authorization_failed
            elif partition is None:
                error = ErrorCode.unknown_topic_or_partition
            elif not pdata.records:
                error, message = ErrorCode.invalid_record, "no records"
            else:
                try:
                    result = partition.append_records(
                        pdata.records,
                        req.transactional_id,
                        broker.transactions.coordinator,
                        produce_version=request.api_version,
                        max_decompressed_bytes=broker.config.message_max_decompressed_bytes,
                    )
                except AppendRefused as e:
                    error, message = e.code, str(e)
                    if record_error_cls is not None:
                        record_errors = tuple(
                            build(
                                record_error_cls,
                                batch_index=index,
                                batch_index_error_message=text,
                            )
                            for index, text in e.record_errors
                        )
                    log.info("produce to %s-%d refused: %s", topic_data.name, pdata.index, e)
                else:
                    base_offset, append_time = result.first_offset, result.log_append_time
                    start = result.log_start_offset
                    # A duplicate is answered once its original is durable, like any write.
                    touched.append(partition)
            parts_out.append(
                build(
                    part_cls,
                    index=pdata.index,
                    error_code=error,
                    base_offset=base_offset,
                    log_append_time=to_datetime(append_time),
                    log_start_offset=start,
                    record_errors=record_errors,
                    error_message=message,
                )
            )
        topics_out.append(
            build(topic_cls, name=topic_data.name, partition_responses=tuple(parts_out))
        )
    response = build(cls, responses=tuple(topics_out), throttle_time=datetime.timedelta(0))
    durable = broker.make_durable(touched)
    if req.acks == -1 and touched:
        return _after(durable, response)
    return None if req.acks == 0 else response


async def _after(durable: asyncio.Future[None], response: Any) -> Any:
    try:
        await durable
    except PartitionsNotDurableError as e:
        # Those partitions answer their error (deleted, or not yet synced); the others stand.
        response = _with_errors(response, e.errors)
    crash_point("produce.before-response")
    await delay_point("produce.before-response")
    return response


def _with_errors(response: Any, errors: dict[tuple[str, int], ErrorCode]) -> Any:
    def part(topic: str, p: Any) -> Any:
        code = errors.get((topic, p.index))
        if code is None:
            return p
        return dataclasses.replace(
            p, error_code=code, base_offset=-1, log_append_time=None, log_start_offset=-1
        )

    topics = tuple(
        dataclasses.replace(
            t, partition_responses=tuple(part(t.name, p) for p in t.partition_responses)
        )
        for t in response.responses
    )
    return dataclasses.replace(response, responses=topics)
