"""InitProducerId (22), AddPartitionsToTxn (24), AddOffsetsToTxn (25), EndTxn (26),
TxnOffsetCommit (28), DescribeTransactions (65), ListTransactions (66), DescribeProducers (61)."""

from __future__ import annotations

import asyncio
import datetime
import inspect
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.dispatch import api
from onceflow.broker.handlers.offsets import commit_response, requested_offsets
from onceflow.broker.transactions import (
    HELD_REQUEST_TIMEOUT_S,
    OFFSETS_TOPIC,
    CoordinatorUnavailableError,
)
from onceflow.protocol.entities import build, sibling
from onceflow.protocol.messages import response_type
from onceflow.security import authorization as auth
from onceflow.txn.coordinator import InitProducerIdResponse, TxnDescription, error_for_version

if TYPE_CHECKING:
    from onceflow.broker.server import Broker
    from onceflow.protocol.messages import Request

log = logging.getLogger(__name__)

ZERO = datetime.timedelta(0)


def _ms(delta: datetime.timedelta) -> int:
    return int(delta.total_seconds() * 1000)


def _datetime(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


def _after_markers(
    broker: Broker,
    transactional_id: str | None,
    start: Callable[[], Any],
    busy: Callable[[ErrorCode], Any],
) -> Any:
    """`start()` now, or once the id's markers in flight are written (pending_markers). Held
    at most HELD_REQUEST_TIMEOUT_S: then `busy(CONCURRENT_TRANSACTIONS)` answers, which is what
    Kafka answers at once while markers are in flight, and clients retry."""
    pending = broker.transactions.pending_markers(transactional_id)
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


@api(22, 0, 5)
def handle_init_producer_id(broker: Broker, request: Request) -> Any:
    req = request.body
    if (refused := _init_refused(request)) is not None:
        return _init_answer(request, InitProducerIdResponse(refused))
    return _after_markers(
        broker,
        req.transactional_id,
        lambda: _init(broker, request),
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


def _init(broker: Broker, request: Request) -> Any:
    req = request.body
    result = broker.transactions.coordinator.init_producer_id(
        req.transactional_id,
        _ms(req.transaction_timeout),
        getattr(req, "producer_id", -1),
        getattr(req, "producer_epoch", -1),
    )
    return _init_response(broker, request, result)


async def _init_response(broker: Broker, request: Request, result: Any) -> Any:
    try:
        answer = await broker.transactions.run(result)
    except CoordinatorUnavailableError as e:
        answer = InitProducerIdResponse(e.error_code)
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
    return build(
        response_type(22, request.api_version),
        throttle_time=ZERO,
        error_code=error_for_version(answer.error, 22, request.api_version),
        producer_id=answer.producer_id,
        producer_epoch=answer.producer_epoch,
    )


@api(24, 0, 3)
def handle_add_partitions_to_txn(broker: Broker, request: Request) -> Any:
    txn_id = request.body.v3_and_below_transactional_id
    if not _may_write_txn(request, txn_id):
        failed = ErrorCode.transactional_id_authorization_failed
        return _add_partitions_response(request, _every_partition(request, failed))
    return _after_markers(
        broker,
        txn_id,
        lambda: _add_partitions(broker, request),
        lambda error: _add_partitions_response(request, _every_partition(request, error)),
    )


def _every_partition(request: Request, error: ErrorCode) -> dict[tuple[str, int], ErrorCode]:
    return {(t.name, p): error for t in request.body.v3_and_below_topics for p in t.partitions}


def _add_partitions(broker: Broker, request: Request) -> Any:
    req = request.body
    wanted = [(t.name, p) for t in req.v3_and_below_topics for p in t.partitions]
    writable = set(
        auth.filter_authorized(request.session, auth.WRITE, auth.TOPIC, {t for t, _ in wanted})
    )
    refused = {tp: ErrorCode.topic_authorization_failed for tp in wanted if tp[0] not in writable}
    unknown = {tp: ErrorCode.unknown_topic_or_partition for tp in wanted if tp not in refused
               and broker.topics.partition(*tp) is None}  # fmt: skip
    if refused or unknown:
        # As Kafka: nothing is added; those partitions fail, the others are not attempted.
        failed = {**unknown, **refused}
        errors = {tp: failed.get(tp, ErrorCode.operation_not_attempted) for tp in wanted}
        return _add_partitions_response(request, errors)
    result = broker.transactions.coordinator.add_partitions(
        req.v3_and_below_transactional_id,
        req.v3_and_below_producer_id,
        req.v3_and_below_producer_epoch,
        wanted,
    )
    return _add_partitions_later(broker, request, result)


async def _add_partitions_later(broker: Broker, request: Request, result: Any) -> Any:
    try:
        errors = await broker.transactions.run(result)
    except CoordinatorUnavailableError as e:
        errors = _every_partition(request, e.error_code)
    return _add_partitions_response(request, errors)


def _add_partitions_response(request: Request, errors: dict[tuple[str, int], ErrorCode]) -> Any:
    cls = response_type(24, request.api_version)
    topic_cls = sibling(cls, "AddPartitionsToTxnTopicResult")
    part_cls = sibling(cls, "AddPartitionsToTxnPartitionResult")
    by_topic: dict[str, list[Any]] = defaultdict(list)
    for (topic, partition), error in errors.items():
        by_topic[topic].append(
            build(
                part_cls,
                partition_index=partition,
                partition_error_code=error_for_version(error, 24, request.api_version),
            )
        )
    return build(
        cls,
        throttle_time=ZERO,
        results_by_topic_v3_and_below=tuple(
            build(topic_cls, name=n, results_by_partition=tuple(ps)) for n, ps in by_topic.items()
        ),
    )


@api(25, 0, 4)
def handle_add_offsets_to_txn(broker: Broker, request: Request) -> Any:
    req = request.body
    if not _may_write_txn(request, req.transactional_id):
        return _simple_answer(request, 25, ErrorCode.transactional_id_authorization_failed)
    if not auth.authorize(request.session, auth.READ, auth.GROUP, req.group_id):
        return _simple_answer(request, 25, ErrorCode.group_authorization_failed)

    def add() -> Any:
        result = broker.transactions.coordinator.add_offsets(
            req.transactional_id, req.producer_id, req.producer_epoch, req.group_id
        )
        return _simple_later(broker, request, 25, result)

    return _after_markers(
        broker, req.transactional_id, add, lambda error: _simple_answer(request, 25, error)
    )


@api(26, 0, 4)
def handle_end_txn(broker: Broker, request: Request) -> Any:
    req = request.body
    if not _may_write_txn(request, req.transactional_id):
        return _simple_answer(request, 26, ErrorCode.transactional_id_authorization_failed)
    result = broker.transactions.coordinator.end_txn(
        req.transactional_id, req.producer_id, req.producer_epoch, req.committed
    )
    return _simple_later(broker, request, 26, result)


def _may_write_txn(request: Request, transactional_id: str) -> bool:
    return auth.authorize(request.session, auth.WRITE, auth.TRANSACTIONAL_ID, transactional_id)


async def _simple_later(broker: Broker, request: Request, api_key: int, result: Any) -> Any:
    try:
        error = await broker.transactions.run(result)
    except CoordinatorUnavailableError as e:
        error = e.error_code
    return _simple_answer(request, api_key, error)


def _simple_answer(request: Request, api_key: int, error: ErrorCode) -> Any:
    return build(
        response_type(api_key, request.api_version),
        throttle_time=ZERO,
        error_code=error_for_version(error, api_key, request.api_version),
    )


@api(28, 0, 4)
def handle_txn_offset_commit(broker: Broker, request: Request) -> Any:
    req = request.body
    cls = response_type(28, request.api_version)
    if not _may_write_txn(request, req.transactional_id):
        refused: ErrorCode | None = ErrorCode.transactional_id_authorization_failed
    elif not auth.authorize(request.session, auth.READ, auth.GROUP, req.group_id):
        refused = ErrorCode.group_authorization_failed
    else:
        refused = None
    if refused is not None:
        every = [(t.name, p.partition_index) for t in req.topics for p in t.partitions]
        return commit_response(cls, dict.fromkeys(every, refused))
    offsets, errors = requested_offsets(broker, req.topics, request.session)
    coordinator = broker.transactions.coordinator
    if not broker.transactions.verify_partition(
        req.transactional_id, req.producer_id, req.producer_epoch, OFFSETS_TOPIC, 0
    ):
        # The offsets partition must be in the transaction (AddOffsetsToTxn first).
        meta = coordinator.get(req.transactional_id)
        error = ErrorCode.invalid_txn_state
        if meta is None or meta.producer_id != req.producer_id:
            error = ErrorCode.invalid_producer_id_mapping
        elif meta.producer_epoch != req.producer_epoch:
            error = error_for_version(ErrorCode.producer_fenced, 28, request.api_version)
        errors.update(dict.fromkeys(offsets, error))
        return commit_response(cls, errors)
    result = broker.groups.txn_commit_offsets(
        req.transactional_id,
        req.group_id,
        req.producer_id,
        req.producer_epoch,
        getattr(req, "generation_id", -1),
        getattr(req, "member_id", ""),
        getattr(req, "group_instance_id", None),
        offsets,
    )
    errors.update(result.response)
    response = commit_response(cls, errors)
    return broker.write_offsets_records(
        result.records, response, producer_id=req.producer_id, producer_epoch=req.producer_epoch
    )


@api(65, 0, 0)
def handle_describe_transactions(broker: Broker, request: Request) -> Any:
    cls = response_type(65, request.api_version)
    state_cls = sibling(cls, "TransactionState")
    topic_cls = sibling(cls, "TopicData")
    states = tuple(
        build(
            state_cls,
            error_code=d.error,
            transactional_id=d.transactional_id,
            transaction_state=d.state,
            transaction_timeout=datetime.timedelta(milliseconds=d.transaction_timeout_ms),
            transaction_start_time=_datetime(d.transaction_start_time_ms),
            producer_id=d.producer_id,
            producer_epoch=d.producer_epoch,
            topics=tuple(
                build(topic_cls, topic=t, partitions=ps)
                for t, ps in auth.filter_authorized(
                    request.session, auth.DESCRIBE, auth.TOPIC, d.topics, lambda t: t[0]
                )
            ),
        )
        for d in _describe_transactions(broker, request)
    )
    return build(cls, throttle_time=ZERO, transaction_states=states)


def _describe_transactions(broker: Broker, request: Request) -> list[TxnDescription]:
    """DESCRIBE on each transactional id, else TRANSACTIONAL_ID_AUTHORIZATION_FAILED."""
    ids = list(request.body.transactional_ids)
    allowed = set(
        auth.filter_authorized(request.session, auth.DESCRIBE, auth.TRANSACTIONAL_ID, ids)
    )
    found = iter(broker.transactions.coordinator.describe([i for i in ids if i in allowed]))
    failed = ErrorCode.transactional_id_authorization_failed
    return [next(found) if i in allowed else TxnDescription(i, failed) for i in ids]


@api(66, 0, 1)
def handle_list_transactions(broker: Broker, request: Request) -> Any:
    req = request.body
    cls = response_type(66, request.api_version)
    state_cls = sibling(cls, "TransactionState")
    known = {
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "Dead",
        "PrepareEpochFence",
    }
    listings = auth.filter_authorized(
        request.session,
        auth.DESCRIBE,
        auth.TRANSACTIONAL_ID,
        broker.transactions.coordinator.list(
            req.state_filters, req.producer_id_filters, getattr(req, "duration_filter", -1)
        ),
        lambda t: t.transactional_id,
    )
    return build(
        cls,
        throttle_time=ZERO,
        error_code=ErrorCode.none,
        unknown_state_filters=tuple(s for s in req.state_filters if s not in known),
        transaction_states=tuple(
            build(
                state_cls,
                transactional_id=t.transactional_id,
                producer_id=t.producer_id,
                transaction_state=t.state,
            )
            for t in listings
        ),
    )


@api(61, 0, 0)
def handle_describe_producers(broker: Broker, request: Request) -> Any:
    cls = response_type(61, request.api_version)
    topic_cls = sibling(cls, "TopicResponse")
    part_cls = sibling(cls, "PartitionResponse")
    producer_cls = sibling(cls, "ProducerState")
    topics = []
    for t in request.body.topics:
        parts = []
        readable = auth.authorize(request.session, auth.READ, auth.TOPIC, t.name)
        for index in t.partition_indexes:
            partition = broker.topics.partition(t.name, index) if readable else None
            if partition is None:
                parts.append(
                    build(
                        part_cls,
                        partition_index=index,
                        error_code=ErrorCode.unknown_topic_or_partition
                        if readable
                        else ErrorCode.topic_authorization_failed,
                        error_message=None,
                        active_producers=(),
                    )
                )
                continue
            producers = tuple(
                build(
                    producer_cls,
                    producer_id=p.producer_id,
                    producer_epoch=p.producer_epoch,
                    last_sequence=p.last_sequence,
                    last_timestamp=p.last_timestamp,
                    coordinator_epoch=p.coordinator_epoch,
                    current_txn_start_offset=p.current_txn_start_offset,
                )
                for p in partition.producers.producers()
            )
            parts.append(
                build(
                    part_cls,
                    partition_index=index,
                    error_code=ErrorCode.none,
                    error_message=None,
                    active_producers=producers,
                )
            )
        topics.append(build(topic_cls, name=t.name, partitions=tuple(parts)))
    return build(cls, throttle_time=ZERO, topics=tuple(topics))
