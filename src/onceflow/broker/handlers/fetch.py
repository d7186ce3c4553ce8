"""Fetch (1): each partition's `UnifiedLog.read` (whole batches as stored, up to the high
watermark or, for read_committed, the last stable offset, with the aborted transactions),
translated into the response, with long polling on max wait / min bytes."""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.fetch_max_bytes import response_bytes_bound
from onceflow.broker.handlers.context import DataContext
from onceflow.broker.handlers.responses import response_classes
from onceflow.broker.handlers.slices import SLICED_ABOVE, Work, in_slices, run_now, run_sliced
from onceflow.log.errors import DescriptorsExhaustedError, OffsetOutOfRangeError
from onceflow.log.unified_log import FetchIsolation
from onceflow.protocol.entities import build
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.broker.partition import Partition
    from onceflow.protocol.messages import Request

READ_COMMITTED = 1


@dataclass
class _Wanted:
    key: Any  # topic name or topic id, as the request named it
    partition: Partition | None
    index: int
    fetch_offset: int
    max_bytes: int
    unknown_error: ErrorCode


def _resolve(ctx: DataContext, req: Any, by_id: bool, session: Any = None) -> Work:
    """The partitions asked for, one step each."""
    out = []
    for topic in req.topics:
        if not topic.partitions:
            continue  # nothing asked: Kafka leaves such topics out of the answer
        key = topic.topic_id if by_id else topic.topic
        found = ctx.topics.by_id(key) if by_id else ctx.topics.get(key)
        error = ErrorCode.unknown_topic_id if by_id else ErrorCode.unknown_topic_or_partition
        name = found.name if by_id and found is not None else key
        if (found is not None or not by_id) and not auth.authorize(
            session, auth.READ, auth.TOPIC, name
        ):
            found, error = None, ErrorCode.topic_authorization_failed
        row = []
        for p in topic.partitions:
            partition = None
            if found is not None and 0 <= p.partition < len(found.partitions):
                partition = found.partitions[p.partition]
            elif found is not None:
                error = ErrorCode.unknown_topic_or_partition
            row.append(
                _Wanted(key, partition, p.partition, p.fetch_offset, p.partition_max_bytes, error)
            )
            yield
        out.append(row)
    return out


def _read(ctx: DataContext, request: Request, wanted: list[list[_Wanted]]) -> Work:
    """Build the response from the logs: (response, bytes of records, any error), one step
    per partition."""
    req = request.body
    cls, topic_cls, part_cls, aborted_cls = response_classes(
        request, "FetchableTopicResponse", "PartitionData", "AbortedTransaction"
    )
    isolation = (
        FetchIsolation.TXN_COMMITTED
        if req.isolation_level == READ_COMMITTED
        else FetchIsolation.HIGH_WATERMARK
    )
    budget = response_bytes_bound(ctx.config.fetch_max_bytes, request)
    total = 0
    any_error = False
    topics_out = []
    for row in wanted:
        parts_out = []
        for w in row:
            p = w.partition
            error, records = ErrorCode.none, b""
            hw = lso = start = -1
            aborted = None
            if p is None:
                error = w.unknown_error
            else:
                limit = min(w.max_bytes, budget - total)
                try:
                    # Only the response's first batch may exceed the limits (KIP-74).
                    info = p.read(w.fetch_offset, limit, isolation, min_one=total == 0)
                    records = info.records
                    hw, lso = info.high_watermark, info.last_stable_offset
                    start = info.log_start_offset
                    if info.aborted_transactions is not None:
                        aborted = tuple(
                            aborted_cls(producer_id=pid, first_offset=first)
                            for pid, first in info.aborted_transactions
                        )
                except OffsetOutOfRangeError:
                    error = ErrorCode.offset_out_of_range
                except DescriptorsExhaustedError:
                    error = ErrorCode.kafka_storage_error  # retriable: out of descriptors
            if error != ErrorCode.none:
                any_error = True
                # As Kafka's FetchResponse.partitionResponse(error): no offsets, no aborted list.
                hw = lso = start = -1
                records = b""
                aborted = None
            total += len(records)
            parts_out.append(
                build(
                    part_cls,
                    partition_index=w.index,
                    error_code=error,
                    high_watermark=hw,
                    last_stable_offset=lso,
                    log_start_offset=start,
                    aborted_transactions=aborted,
                    preferred_read_replica=-1,
                    records=records,
                )
            )
            yield
        topics_out.append(
            build(
                topic_cls,
                topic=row[0].key if row else None,
                topic_id=row[0].key if row else None,
                partitions=tuple(parts_out),
            )
        )
    response = build(
        cls,
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        session_id=0,
        responses=tuple(topics_out),
        node_endpoints=(),
    )
    return response, total, any_error


def handle_fetch(ctx: DataContext, request: Request) -> Any:
    # 200,000 partitions held the event loop 5 s at once; a client's Fetch stays far below.
    named = sum(len(t.partitions) for t in request.body.topics)
    return in_slices(_fetch(ctx, request, named > SLICED_ABOVE), named)


def _fetch(ctx: DataContext, request: Request, sliced: bool) -> Work:
    req = request.body
    wanted = yield from _resolve(ctx, req, request.api_version >= 13, request.session)
    response, size, any_error = yield from _read(ctx, request, wanted)
    max_wait = req.max_wait.total_seconds()
    if any_error or size >= max(req.min_bytes, 1) or max_wait <= 0:
        return response
    return _long_poll(ctx, request, wanted, max_wait, sliced)


async def _long_poll(
    ctx: DataContext, request: Request, wanted: list[list[_Wanted]], max_wait: float, sliced: bool
) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait
    woken = asyncio.Event()
    partitions = {w.partition for row in wanted for w in row if w.partition is not None}
    for p in partitions:
        p.listeners.add(woken.set)
    try:
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(woken.wait(), remaining)
            except TimeoutError:
                break
            woken.clear()
            response, size, any_error = await _read_again(ctx, request, wanted, sliced)
            if any_error or size >= max(request.body.min_bytes, 1):
                return response
    finally:
        for p in partitions:
            p.listeners.discard(woken.set)
    return (await _read_again(ctx, request, wanted, sliced))[0]


async def _read_again(
    ctx: DataContext, request: Request, wanted: list[list[_Wanted]], sliced: bool
) -> tuple[Any, int, bool]:
    """A long poll's read, in slices when the request is big."""
    work = _read(ctx, request, wanted)
    return await run_sliced(work) if sliced else run_now(work)  # type: ignore[no-any-return]
