"""InitProducerId (22), AddPartitionsToTxn (24), AddOffsetsToTxn (25), EndTxn (26),
TxnOffsetCommit (28), DescribeTransactions (65), ListTransactions (66), DescribeProducers (61)."""

from __future__ import annotations

import asyncio
import datetime
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers.context import DataContext, TxnContext
from onceflow.broker.handlers.offsets import (
    answer_when_written,
    commit_response,
    partitions_named,
    requested_offsets,
)
from onceflow.broker.handlers.responses import (
    build_from,
    by_topic_in_steps,
    response_class,
    response_classes,
)
from onceflow.broker.handlers.slices import SLICED_ABOVE, Work, in_slices, run_now, run_sliced
from onceflow.coordinator.coordinators import (
    HELD_REQUEST_TIMEOUT_S,
    OFFSETS_TOPIC,
    CoordinatorUnavailableError,
)
from onceflow.coordinator.result import CoordinatorResult
from onceflow.protocol.entities import build
from onceflow.security import authorization as auth
from onceflow.txn.coordinator import (
    EndTxnResponse,
    InitProducerIdResponse,
    TxnDescription,
    error_for_version,
)
from onceflow.txn.transaction_metadata import EPOCH_BUMP_TRANSACTION_VERSION

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request

log = logging.getLogger(__name__)

ZERO = datetime.timedelta(0)
# The first versions a transactions version 2 client sends (KIP-890 part 2).
END_TXN_V2_SINCE = 5
TXN_OFFSET_COMMIT_V2_SINCE = 5
# How soon the leader's add looks again while another add of the producer is being written
# (one fsync of the transaction log: a few milliseconds).
ADD_RETRY_BACKOFF_S = 0.002
T = TypeVar("T")


def _ms(delta: datetime.timedelta) -> int:
    return int(delta.total_seconds() * 1000)


def _datetime(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


def _after_markers(
    ctx: TxnContext,
    transactional_id: str | None,
    start: Callable[[], Any],
    busy: Callable[[ErrorCode], Any],
) -> Any:
    """`start()` now, or once the id's markers in flight are written (pending_markers). Held
    at most HELD_REQUEST_TIMEOUT_S: then `busy(CONCURRENT_TRANSACTIONS)` answers, which is what
    Kafka answers at once while markers are in flight, and clients retry."""
    pending = ctx.driver.pending_markers(transactional_id)
    if pending is None:
        return start()

    async def later() -> Any:
        # asyncio.wait never cancels the markers if the client goes away or the bound passes.
        done, _ = await asyncio.wait([pending], timeout=HELD_REQUEST_TIMEOUT_S)
        if not done:
            return busy(ErrorCode.concurrent_transactions)
        answer = start()
        return await answer if inspect.isawaitable(answer) else answer

    return later()


def handle_init_producer_id(ctx: TxnContext, request: Request) -> Any:
    req = request.body
    if (refused := _init_refused(request)) is not None:
        return _init_answer(request, InitProducerIdResponse(refused))
    if req.transactional_id is not None and ctx.groups.coordinator.loading:
        # Fencing may abort a transaction, whose markers settle offsets still being loaded.
        return _init_answer(request, InitProducerIdResponse(ErrorCode.coordinator_load_in_progress))
    return _after_markers(
        ctx,
        req.transactional_id,
        lambda: _init(ctx, request),
        lambda error: _init_answer(request, InitProducerIdResponse(error)),
    )


def _init_refused(request: Request) -> ErrorCode | None:
    """WRITE on the transactional id; without one (an idempotent producer), IDEMPOTENT_WRITE
    on the Cluster or WRITE on some topic (Kafka 3+)."""
    session, txn_id = request.session, request.body.transactional_id
    if txn_id is not None:
        if auth.authorize(session, auth.WRITE, auth.TRANSACTIONAL_ID, txn_id):
            return None
        return ErrorCode.transactional_id_authorization_failed
    if auth.authorize(
        session, auth.IDEMPOTENT_WRITE, auth.CLUSTER, log_if_denied=False
    ) or auth.authorize_by_resource_type(session, auth.WRITE, auth.TOPIC):
        return None
    return ErrorCode.cluster_authorization_failed


def _init(ctx: TxnContext, request: Request) -> Any:
    req = request.body
    result = ctx.coordinator.init_producer_id(
        req.transactional_id,
        _ms(req.transaction_timeout),
        getattr(req, "producer_id", -1),
        getattr(req, "producer_epoch", -1),
    )
    return _init_response(ctx, request, result)


async def _run(
    ctx: TxnContext, result: CoordinatorResult[T], unavailable: Callable[[ErrorCode], T]
) -> T:
    """The coordinator's result run by the driver (written, durable, replayed); when it could not
    be written, what `unavailable` makes of COORDINATOR_NOT_AVAILABLE."""
    try:
        return await ctx.driver.run(result)
    except CoordinatorUnavailableError as e:
        return unavailable(e.error_code)


async def _init_response(
    ctx: TxnContext, request: Request, result: CoordinatorResult[InitProducerIdResponse]
) -> Any:
    answer = await _run(ctx, result, InitProducerIdResponse)
    if answer.error == ErrorCode.none and request.body.transactional_id:
        # As Kafka logs it: the epochs a transactional id was given, for post-mortems.
        log.info(
            "initialized transactional id %r with producer id %d and epoch %d",
            request.body.transactional_id,
            answer.producer_id,
            answer.producer_epoch,
        )
    return _init_answer(request, answer)


def _init_answer(request: Request, answer: InitProducerIdResponse) -> Any:
    return build_from(
        response_class(request),
        answer,
        throttle_time=ZERO,
        error_code=error_for_version(answer.error, request.api_key, request.api_version),
    )


def handle_add_partitions_to_txn(ctx: TxnContext, request: Request) -> Any:
    named = sum(len(t.partitions) for t in request.body.v3_and_below_topics)
    return in_slices(_add_partitions_to_txn(ctx, request, named > SLICED_ABOVE), named)


def _every_partition(request: Request, error: ErrorCode) -> dict[tuple[str, int], ErrorCode]:
    return {(t.name, p): error for t in request.body.v3_and_below_topics for p in t.partitions}


def _add_partitions_to_txn(ctx: TxnContext, request: Request, sliced: bool) -> Work:
    """The partitions checked one step each (200,000 held the event loop 3 s at once), as
    Kafka's KafkaApis checks them before the coordinator; then the coordinator's turn, after
    the producer's markers in flight, with the partitions that exist (as many as the cluster's)."""
    req = request.body
    txn_id = req.v3_and_below_transactional_id
    if not _may_write_txn(request, txn_id):
        failed = ErrorCode.transactional_id_authorization_failed
        return (yield from _add_partitions_response(request, _every_partition(request, failed)))
    wanted = []
    writable: dict[str, bool] = {}
    refused: dict[tuple[str, int], ErrorCode] = {}
    for t in req.v3_and_below_topics:
        if t.name not in writable:
            writable[t.name] = auth.authorize(
                request.session, auth.WRITE, auth.TOPIC, t.name, log_if_denied=False
            )
        for p in t.partitions:
            tp = (t.name, p)
            wanted.append(tp)
            if not writable[t.name]:
                refused[tp] = ErrorCode.topic_authorization_failed
            elif ctx.groups.partitions.partition(t.name, p) is None:
                refused[tp] = ErrorCode.unknown_topic_or_partition
            yield
    if refused:
        # As Kafka: nothing is added; those partitions fail, the others are not attempted.
        errors = {}
        for tp in wanted:
            errors[tp] = refused.get(tp, ErrorCode.operation_not_attempted)
            yield
        return (yield from _add_partitions_response(request, errors))

    def add() -> Any:
        result = ctx.coordinator.add_partitions(
            txn_id, req.v3_and_below_producer_id, req.v3_and_below_producer_epoch, wanted
        )
        return _add_partitions_later(ctx, request, result, sliced)

    def busy(error: ErrorCode) -> Any:
        return run_now(_add_partitions_response(request, _every_partition(request, error)))

    return _after_markers(ctx, txn_id, add, busy)


async def _add_partitions_later(
    ctx: TxnContext,
    request: Request,
    result: CoordinatorResult[dict[tuple[str, int], ErrorCode]],
    sliced: bool,
) -> Any:
    errors = await _run(ctx, result, lambda error: _every_partition(request, error))
    response = _add_partitions_response(request, errors)
    return await run_sliced(response) if sliced else run_now(response)


def _add_partitions_response(request: Request, errors: dict[tuple[str, int], ErrorCode]) -> Work:
    cls, topic_cls, part_cls = response_classes(
        request, "AddPartitionsToTxnTopicResult", "AddPartitionsToTxnPartitionResult"
    )
    parts = []
    for (topic, index), error in errors.items():
        code = error_for_version(error, request.api_key, request.api_version)
        parts.append((topic, build(part_cls, partition_index=index, partition_error_code=code)))
        yield
    return build(
        cls,
        throttle_time=ZERO,
        results_by_topic_v3_and_below=(
            yield from by_topic_in_steps(parts, topic_cls, "results_by_partition")
        ),
    )


def handle_add_offsets_to_txn(ctx: TxnContext, request: Request) -> Any:
    req = request.body
    if not _may_write_txn(request, req.transactional_id):
        return _simple_answer(request, ErrorCode.transactional_id_authorization_failed)
    if not auth.authorize(request.session, auth.READ, auth.GROUP, req.group_id):
        return _simple_answer(request, ErrorCode.group_authorization_failed)

    def add() -> Any:
        result = ctx.coordinator.add_offsets(
            req.transactional_id, req.producer_id, req.producer_epoch, req.group_id
        )
        return _simple_later(ctx, request, result)

    return _after_markers(
        ctx, req.transactional_id, add, lambda error: _simple_answer(request, error)
    )


def handle_end_txn(ctx: TxnContext, request: Request) -> Any:
    req = request.body
    if not _may_write_txn(request, req.transactional_id):
        return _simple_answer(request, ErrorCode.transactional_id_authorization_failed)
    if ctx.groups.coordinator.loading:
        # Its markers settle offsets that __consumer_offsets may not have replayed yet.
        return _simple_answer(request, ErrorCode.coordinator_load_in_progress)
    if request.api_version >= END_TXN_V2_SINCE:
        # Transactions version 2: the epoch is bumped, the answer names the one to go on with.
        return _end_txn_later(
            ctx,
            request,
            ctx.coordinator.end_transaction(
                req.transactional_id,
                req.producer_id,
                req.producer_epoch,
                req.committed,
                client_transaction_version=EPOCH_BUMP_TRANSACTION_VERSION,
            ),
        )
    result = ctx.coordinator.end_txn(
        req.transactional_id, req.producer_id, req.producer_epoch, req.committed
    )
    return _simple_later(ctx, request, result)


async def _end_txn_later(
    ctx: TxnContext, request: Request, result: CoordinatorResult[EndTxnResponse]
) -> Any:
    answer = await _run(ctx, result, EndTxnResponse)
    return build_from(
        response_class(request),
        answer,
        throttle_time=ZERO,
        error_code=error_for_version(answer.error, request.api_key, request.api_version),
    )


def _may_write_txn(request: Request, transactional_id: str) -> bool:
    return auth.authorize(request.session, auth.WRITE, auth.TRANSACTIONAL_ID, transactional_id)


async def _simple_later(ctx: TxnContext, request: Request, result: CoordinatorResult[Any]) -> Any:
    return _simple_answer(request, await _run(ctx, result, lambda error: error))


def _simple_answer(request: Request, error: ErrorCode) -> Any:
    return build(
        response_class(request),
        throttle_time=ZERO,
        error_code=error_for_version(error, request.api_key, request.api_version),
    )


async def add_for_leader(
    ctx: TxnContext,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    partitions: list[tuple[str, int]],
) -> dict[tuple[str, int], ErrorCode]:
    """Transactions version 2: the partition leader adds a version 2 client's partitions to its
    transaction (Kafka's AddPartitionsToTxn v5 with verifyOnly=false, sent by the leader; one
    node does it in-process), once the id's markers in flight are written. The coordinator's
    error per partition. Another add of the same producer's being written (its Produce and its
    TxnOffsetCommit travel together) is waited for, a few milliseconds, rather than answered
    CONCURRENT_TRANSACTIONS, which would abort the producer's transaction."""
    deadline = asyncio.get_running_loop().time() + HELD_REQUEST_TIMEOUT_S
    while True:
        pending = ctx.driver.pending_markers(transactional_id)
        if pending is not None:
            done, _ = await asyncio.wait([pending], timeout=HELD_REQUEST_TIMEOUT_S)
            if not done:
                return dict.fromkeys(partitions, ErrorCode.concurrent_transactions)
        busy = ctx.coordinator.has_pending(transactional_id)
        if not busy or asyncio.get_running_loop().time() >= deadline:
            break
        await asyncio.sleep(ADD_RETRY_BACKOFF_S)
    result = ctx.coordinator.add_partitions(
        transactional_id,
        producer_id,
        producer_epoch,
        partitions,
        client_transaction_version=EPOCH_BUMP_TRANSACTION_VERSION,
    )
    return await _run(ctx, result, lambda error: dict.fromkeys(partitions, error))


def handle_txn_offset_commit(ctx: TxnContext, request: Request) -> Any:
    req = request.body
    if (
        request.api_version >= TXN_OFFSET_COMMIT_V2_SINCE
        and _may_write_txn(request, req.transactional_id)
        and auth.authorize(request.session, auth.READ, auth.GROUP, req.group_id)
    ):
        return _txn_offset_commit_v2(ctx, request)
    return in_slices(_txn_offset_commit(ctx, request), partitions_named(request.body.topics))


async def _txn_offset_commit_v2(ctx: TxnContext, request: Request) -> Any:
    """TxnOffsetCommit v5 (transactions version 2): the group's offsets partition joins the
    transaction here, without AddOffsetsToTxn, then the commit goes on as before."""
    req = request.body
    added = await add_for_leader(
        ctx, req.transactional_id, req.producer_id, req.producer_epoch, [(OFFSETS_TOPIC, 0)]
    )
    error = added[(OFFSETS_TOPIC, 0)]
    if error != ErrorCode.none:
        every = [(t.name, p.partition_index) for t in req.topics for p in t.partitions]
        code = error_for_version(error, request.api_key, request.api_version)
        return run_now(commit_response(response_class(request), dict.fromkeys(every, code)))
    work = _txn_offset_commit(ctx, request)
    sliced = partitions_named(req.topics) > SLICED_ABOVE
    answer = await run_sliced(work) if sliced else run_now(work)
    return await answer if inspect.isawaitable(answer) else answer


def _txn_offset_commit(ctx: TxnContext, request: Request) -> Work:
    """As OffsetCommit (offsets.py): checked in steps, then validated and appended in one."""
    req = request.body
    cls = response_class(request)
    if not _may_write_txn(request, req.transactional_id):
        refused: ErrorCode | None = ErrorCode.transactional_id_authorization_failed
    elif not auth.authorize(request.session, auth.READ, auth.GROUP, req.group_id):
        refused = ErrorCode.group_authorization_failed
    else:
        refused = None
    if refused is not None:
        every = [(t.name, p.partition_index) for t in req.topics for p in t.partitions]
        return (yield from commit_response(cls, dict.fromkeys(every, refused)))
    offsets, errors = yield from requested_offsets(
        ctx.groups.partitions, req.topics, request.session
    )
    if not ctx.driver.verify_partition(
        req.transactional_id, req.producer_id, req.producer_epoch, OFFSETS_TOPIC, 0
    ):
        # The offsets partition must be in the transaction (AddOffsetsToTxn first).
        meta = ctx.coordinator.get(req.transactional_id)
        error = ErrorCode.invalid_txn_state
        if meta is None or meta.producer_id != req.producer_id:
            error = ErrorCode.invalid_producer_id_mapping
        elif meta.producer_epoch != req.producer_epoch:
            error = error_for_version(
                ErrorCode.producer_fenced, request.api_key, request.api_version
            )
        errors.update(dict.fromkeys(offsets, error))
        return (yield from commit_response(cls, errors))
    result = ctx.groups.coordinator.txn_commit_offsets(
        req.transactional_id,
        req.group_id,
        req.producer_id,
        req.producer_epoch,
        getattr(req, "generation_id", -1),
        getattr(req, "member_id", ""),
        getattr(req, "group_instance_id", None),
        offsets,
    )
    written = ctx.groups.write_offsets(
        result.records, None, producer_id=req.producer_id, producer_epoch=req.producer_epoch
    )
    errors.update(result.response)
    response = yield from commit_response(cls, errors)
    return answer_when_written(written, response)


def handle_describe_transactions(ctx: TxnContext, request: Request) -> Any:
    ids = request.body.transactional_ids
    return in_slices(_describe_transactions(ctx, request), len(ids))


def _describe_transactions(ctx: TxnContext, request: Request) -> Work:
    """DESCRIBE on each transactional id, else TRANSACTIONAL_ID_AUTHORIZATION_FAILED; one step
    per id named."""
    cls, state_cls, topic_cls = response_classes(request, "TransactionState", "TopicData")
    failed = ErrorCode.transactional_id_authorization_failed
    states = []
    for i in request.body.transactional_ids:
        if auth.authorize(
            request.session, auth.DESCRIBE, auth.TRANSACTIONAL_ID, i, log_if_denied=False
        ):
            [d] = ctx.coordinator.describe([i])
        else:
            d = TxnDescription(i, failed)
        states.append(
            build_from(
                state_cls,
                d,
                error_code=d.error,
                transaction_state=d.state,
                transaction_timeout=datetime.timedelta(milliseconds=d.transaction_timeout_ms),
                transaction_start_time=_datetime(d.transaction_start_time_ms),
                topics=tuple(
                    build(topic_cls, topic=t, partitions=ps)
                    for t, ps in auth.filter_authorized(
                        request.session, auth.DESCRIBE, auth.TOPIC, d.topics, lambda t: t[0]
                    )
                ),
            )
        )
        yield
    return build(cls, throttle_time=ZERO, transaction_states=tuple(states))


# The states ListTransactions filters on; others are answered as unknown state filters.
_KNOWN_STATES = frozenset(
    {
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "Dead",
        "PrepareEpochFence",
    }
)


def handle_list_transactions(ctx: TxnContext, request: Request) -> Any:
    req = request.body
    cls, state_cls = response_classes(request, "TransactionState")
    listings = auth.filter_authorized(
        request.session,
        auth.DESCRIBE,
        auth.TRANSACTIONAL_ID,
        ctx.coordinator.list(
            req.state_filters, req.producer_id_filters, getattr(req, "duration_filter", -1)
        ),
        lambda t: t.transactional_id,
    )
    return build(
        cls,
        throttle_time=ZERO,
        error_code=ErrorCode.none,
        unknown_state_filters=tuple(s for s in req.state_filters if s not in _KNOWN_STATES),
        transaction_states=tuple(
            build_from(state_cls, t, transaction_state=t.state) for t in listings
        ),
    )


def handle_describe_producers(ctx: DataContext, request: Request) -> Any:
    """The producers' state of each partition (Kafka's partition-level DescribeProducers)."""
    elements = sum(len(t.partition_indexes) for t in request.body.topics)
    return in_slices(_describe_producers(ctx, request), elements)


def _describe_producers(ctx: DataContext, request: Request) -> Work:
    """One step per partition named (200,000 held the event loop 3 s at once)."""
    cls, topic_cls, part_cls, producer_cls = response_classes(
        request, "TopicResponse", "PartitionResponse", "ProducerState"
    )
    topics = []
    for t in request.body.topics:
        readable = auth.authorize(request.session, auth.READ, auth.TOPIC, t.name)
        parts = []
        for index in t.partition_indexes:
            partition = ctx.topics.partition(t.name, index) if readable else None
            error = (
                ErrorCode.unknown_topic_or_partition
                if readable
                else ErrorCode.topic_authorization_failed
            )
            producers: tuple[Any, ...] = ()
            if partition is not None:
                error = ErrorCode.none
                producers = tuple(
                    build_from(producer_cls, p) for p in partition.producers.producers()
                )
            parts.append(
                build(
                    part_cls,
                    partition_index=index,
                    error_code=error,
                    error_message=None,
                    active_producers=producers,
                )
            )
            yield
        topics.append(build(topic_cls, name=t.name, partitions=tuple(parts)))
    return build(cls, throttle_time=ZERO, topics=tuple(topics))
