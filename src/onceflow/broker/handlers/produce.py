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
import inspect
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.durability import PartitionsNotDurableError
from onceflow.broker.handlers.context import DataContext
from onceflow.broker.handlers.responses import build_from, response_classes
from onceflow.broker.partition import append_records_to_leader
from onceflow.fault_points import crash_point, delay_point
from onceflow.protocol.entities import build, has_field, sibling
from onceflow.records.batch import BatchHeader, transactional_header
from onceflow.records.validation import AppendRefused
from onceflow.security import authorization as auth
from onceflow.txn.coordinator import produce_error_for_verification

if TYPE_CHECKING:
    from onceflow.broker.partition import Partition
    from onceflow.protocol.messages import Request

log = logging.getLogger(__name__)

# Refusals Kafka answers without the log start offset (ReplicaManager.appendToLocalLog's first
# case, and KIP-890 verification's); every other refusal of an existing partition
# (out-of-order sequence, stale epoch, invalid record...) carries it.
_WITHOUT_LOG_START_OFFSET = frozenset(
    {
        ErrorCode.message_too_large,
        ErrorCode.record_list_too_large,
        ErrorCode.corrupt_message,
        ErrorCode.kafka_storage_error,
    }
)


def to_datetime(ms: int) -> datetime.datetime | None:
    if ms < 0:
        return None
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


@dataclasses.dataclass(frozen=True)
class _Answer:
    """One partition's answer, fields named as the response's; by default a refusal."""

    error_code: ErrorCode
    error_message: str | None = None
    record_errors: tuple[Any, ...] = ()
    base_offset: int = -1
    log_append_time: datetime.datetime | None = None
    log_start_offset: int = -1


# The first Produce version of a transactions version 2 client: its partitions are added to
# the transaction by the leader (Kafka's AddPartitionsToTxnManager, verifyOnly=false).
PRODUCE_ADDS_PARTITIONS_SINCE = 12


@dataclasses.dataclass(frozen=True, slots=True)
class _TransactionalBatches:
    """A Produce's transactional batches, their first headers read once: per partition named
    (topic, index, header), and the request's error from Kafka's checks of them."""

    batches: list[tuple[str, int, BatchHeader]]
    error: ErrorCode | None

    @property
    def producer(self) -> tuple[int, int] | None:
        """The producer id and epoch (one producer: a request of two has `error`)."""
        for _, _, header in self.batches:
            if header.has_producer_id:
                return header.producer_id, header.producer_epoch
        return None


def handle_produce(ctx: DataContext, request: Request) -> Any:
    txn = _transactional_batches(request)
    if (
        ctx.add_to_transaction is not None
        # acks=0 is never transactional (producers refuse it); nothing to answer, nothing added
        and request.body.acks in (1, -1)
        and txn.error is None
        and (producer := txn.producer) is not None
    ):
        before = ctx.producers.waiting(producer[0])
        if before is not None or _partitions_to_add(ctx, request, txn):
            appended = ctx.producers.join(producer[0])
            return _produce_in_order(ctx, request, txn, producer, before, appended)
    return _produce(ctx, request, txn.error, {})


def _partitions_to_add(
    ctx: DataContext, request: Request, txn: _TransactionalBatches
) -> list[tuple[str, int]]:
    """The partitions a version 2 producer's Produce would open its transaction on (not yet in
    it at the partition), which exist and it may write."""
    if request.body.transactional_id is None or request.api_version < PRODUCE_ADDS_PARTITIONS_SINCE:
        return []
    writable: dict[str, bool] = {}
    wanted: list[tuple[str, int]] = []
    for topic, index, header in txn.batches:
        if not header.has_producer_id:
            continue
        if topic not in writable:
            writable[topic] = auth.authorize(
                request.session, auth.WRITE, auth.TOPIC, topic, log_if_denied=False
            )
        partition = ctx.topics.partition(topic, index) if writable[topic] else None
        if partition is not None and partition.needs_verification(header):
            wanted.append((topic, index))
    return wanted


async def _produce_in_order(
    ctx: DataContext,
    request: Request,
    txn: _TransactionalBatches,
    producer: tuple[int, int],
    before: asyncio.Future[None] | None,
    appended: asyncio.Future[None],
) -> Any:
    """A transactional Produce appended after the same producer's earlier requests
    (producer_queue.py). A version 2 producer's partitions are added first, then the append,
    whose verification finds them in the transaction; a partition the coordinator refused
    answers the coordinator's error as Produce gives it, and is not appended."""
    assert ctx.add_to_transaction is not None
    try:
        if before is not None:
            await asyncio.wait([before])
        refused: dict[tuple[str, int], ErrorCode] = {}
        wanted = _partitions_to_add(ctx, request, txn)
        if wanted:
            added = await ctx.add_to_transaction(request.body.transactional_id, *producer, wanted)
            refused = {
                tp: produce_error_for_verification(error, request.api_version)
                for tp, error in added.items()
                if error != ErrorCode.none
            }
            await delay_point("produce.after-add")
        answer = _produce(ctx, request, None, refused)
    finally:
        if not appended.done():
            appended.set_result(None)
    return await answer if inspect.isawaitable(answer) else answer


def _produce(
    ctx: DataContext,
    request: Request,
    txn_error: ErrorCode | None,
    refused: dict[tuple[str, int], ErrorCode],
) -> Any:
    req = request.body
    cls, topic_cls, part_cls = response_classes(
        request, "TopicProduceResponse", "PartitionProduceResponse"
    )
    # Produce v8+ names the records at fault (KIP-467)
    record_error_cls = (
        sibling(cls, "BatchIndexAndErrorMessage") if has_field(part_cls, "record_errors") else None
    )
    error_all = ErrorCode.invalid_required_acks if req.acks not in (0, 1, -1) else txn_error
    touched: list[Partition] = []
    topics_out = []
    for topic_data in req.topic_data:
        writable = auth.authorize(request.session, auth.WRITE, auth.TOPIC, topic_data.name)
        parts_out = []
        for pdata in topic_data.partition_data:
            if error_all is not None:
                answer = _Answer(error_all)
            elif (topic_data.name, pdata.index) in refused:
                answer = _Answer(refused[(topic_data.name, pdata.index)])
            elif not writable:
                answer = _Answer(ErrorCode.topic_authorization_failed)
            else:
                answer = _append(ctx, request, topic_data.name, pdata, record_error_cls, touched)
            parts_out.append(build_from(part_cls, answer, index=pdata.index))
        topics_out.append(
            build(topic_cls, name=topic_data.name, partition_responses=tuple(parts_out))
        )
    response = build(cls, responses=tuple(topics_out), throttle_time=datetime.timedelta(0))
    durable = ctx.durability.make_durable(touched)
    if req.acks == -1 and touched:
        return _after(durable, response)
    return None if req.acks == 0 else response


def _transactional_batches(request: Request) -> _TransactionalBatches:
    """A Produce's transactional batches, with Kafka's checks of them before anything is
    appended.

    Transactional records need a transactional id the principal may write, with or without an
    authorizer (KafkaApis.handleProduceRequest): otherwise anyone who can write the topic could
    write into another producer's open transaction under its producer id (read from
    DescribeProducers). A request's transactional batches are of one producer
    (ReplicaManager.handleProduceAppend). Here over every partition named, where Kafka looks only
    at those it goes on to append; the answer is the same error for the whole request.
    """
    req = request.body
    batches = [
        (topic_data.name, pdata.index, header)
        for topic_data in req.topic_data
        for pdata in topic_data.partition_data
        if (header := transactional_header(pdata.records or b"")) is not None
    ]
    error: ErrorCode | None = None
    if batches and (
        req.transactional_id is None
        or not auth.authorize(
            request.session, auth.WRITE, auth.TRANSACTIONAL_ID, req.transactional_id
        )
    ):
        error = ErrorCode.transactional_id_authorization_failed
    elif len({(h.producer_id, h.producer_epoch) for _, _, h in batches if h.has_producer_id}) > 1:
        error = ErrorCode.invalid_producer_id_mapping
    return _TransactionalBatches(batches, error)


def _append(
    ctx: DataContext,
    request: Request,
    topic: str,
    pdata: Any,
    record_error_cls: type | None,
    touched: list[Partition],
) -> _Answer:
    partition = ctx.topics.partition(topic, pdata.index)
    if partition is None:
        return _Answer(ErrorCode.unknown_topic_or_partition)
    if not pdata.records:
        return _Answer(ErrorCode.invalid_record, "no records")
    try:
        result = append_records_to_leader(
            partition,
            pdata.records,
            request.body.transactional_id,
            ctx.transaction_checks,
            produce_version=request.api_version,
            max_decompressed_bytes=ctx.config.message_max_decompressed_bytes,
        )
    except AppendRefused as e:
        log.info("produce to %s-%d refused: %s", topic, pdata.index, e)
        ctx.metrics.produce_failed(topic)
        record_errors: tuple[Any, ...] = ()
        if record_error_cls is not None:
            record_errors = tuple(
                build(record_error_cls, batch_index=index, batch_index_error_message=text)
                for index, text in e.record_errors
            )
        known = not e.verification and e.code not in _WITHOUT_LOG_START_OFFSET
        start = partition.log.log_start_offset if known else -1
        return _Answer(e.code, str(e), record_errors, log_start_offset=start)
    # A duplicate is answered once its original is durable, like any write.
    touched.append(partition)
    ctx.metrics.produced(topic, pdata.records)
    return _Answer(
        ErrorCode.none,
        base_offset=result.first_offset,
        log_append_time=to_datetime(result.log_append_time),
        log_start_offset=result.log_start_offset,
    )


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
        return build_from(type(p), _Answer(code), index=p.index)

    topics = tuple(
        dataclasses.replace(
            t, partition_responses=tuple(part(t.name, p) for p in t.partition_responses)
        )
        for t in response.responses
    )
    return dataclasses.replace(response, responses=topics)
