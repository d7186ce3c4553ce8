"""Metadata (3): one broker that leads every partition; topics auto-created when allowed."""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Callable, Generator, Iterable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers.context import AdminContext
from onceflow.broker.handlers.responses import response_class
from onceflow.broker.handlers.slices import Work, in_slices, run_sliced
from onceflow.broker.topics import NewTopic, Topic, TopicError, validate_topic_name
from onceflow.protocol.entities import build, sibling
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request

log = logging.getLogger(__name__)

LEADER_EPOCH = 0  # a single node is leader of everything forever


def broker_entity(ctx: AdminContext, cls: type, request: Request) -> Any:
    host, port = ctx.endpoint(request)  # the listener the client connected to
    return build(cls, node_id=ctx.node.node_id, host=host, port=port, rack=None)


async def auto_create(ctx: AdminContext, names: list[str]) -> dict[str, Topic]:
    """Create topics with the broker defaults (one registry change, files off the loop); the
    ones refused are left out."""
    created = {}
    results = await ctx.topics.create_topics(
        [NewTopic(name, ctx.config.num_partitions) for name in names]
    )
    for name, result in zip(names, results, strict=True):
        if isinstance(result, TopicError):
            log.info("auto-creation of %r refused: %s", name, result)
            continue
        log.info("auto-created topic %r with %d partition(s)", name, len(result.partitions))
        created[name] = result
    return created


def handle_metadata(ctx: AdminContext, request: Request) -> Any:
    requested = request.body.topics
    if request.api_version == 0 and not requested:
        requested = None  # v0: an empty list means every topic
    elements = len(ctx.topics) if requested is None else len(requested)
    return in_slices(_metadata(ctx, request, requested), elements)


def _metadata(ctx: AdminContext, request: Request, requested: Any) -> Work:
    """One step per topic named (or per topic, for all of them): 100,000 names took 4 s at
    once. A topic named more than once is answered once, as Kafka takes the names as a set."""
    req = request.body
    cls = response_class(request)
    describe, failed = _describers(ctx, cls)
    allow_auto = getattr(req, "allow_auto_topic_creation", True)
    session = request.session
    auto = allow_auto and ctx.config.auto_create_topics_enable
    if requested is None:  # every topic the principal may describe
        topics = []
        for topic in _describable(session, ctx.topics):
            topics.append(describe(topic))
            yield
    elif request.api_version < 12 and any(
        t.name is None or getattr(t, "topic_id", None) is not None for t in requested
    ):
        # Topic ids are only for v12+ (names are not nullable before): Kafka refuses the request
        # with INVALID_REQUEST on every topic, a missing name answered as "".
        topics = [
            failed(t.name or "", ErrorCode.invalid_request, getattr(t, "topic_id", None))
            for t in requested
        ]
    else:
        wanted: dict[tuple[str | None, Any], Any] = {}
        for t in requested:
            wanted.setdefault((t.name, getattr(t, "topic_id", None)), t)
            yield
        missing = []
        for t in wanted.values():
            if (
                t.name is not None
                and ctx.topics.get(t.name) is None
                and _legal(t.name)
                and _may_create(session, t.name)
            ):
                missing.append(t.name)
            yield
        if missing and auto:
            # Creating makes files: answered once they are made, off the event loop.
            return _after_auto_create(ctx, request, list(wanted.values()), missing)
        topics = yield from _describe_wanted(
            ctx, wanted.values(), describe, failed, {}, session, auto
        )
    return (yield from _metadata_response(ctx, request, cls, topics))


async def _after_auto_create(
    ctx: AdminContext, request: Request, wanted: list[Any], missing: list[str]
) -> Any:
    created = await auto_create(ctx, list(dict.fromkeys(missing)))
    return await run_sliced(
        _described_response(ctx, request, response_class(request), wanted, created)
    )


def _described_response(
    ctx: AdminContext, request: Request, cls: type, wanted: list[Any], created: dict[str, Topic]
) -> Work:
    describe, failed = _describers(ctx, cls)
    topics = yield from _describe_wanted(
        ctx, wanted, describe, failed, created, request.session, True
    )
    return (yield from _metadata_response(ctx, request, cls, topics))


def _describers(ctx: AdminContext, cls: type) -> tuple[Callable[..., Any], Callable[..., Any]]:
    topic_cls = sibling(cls, "MetadataResponseTopic")
    partition_cls = sibling(cls, "MetadataResponsePartition")
    node = ctx.node.node_id

    def describe(topic: Topic) -> Any:
        partitions = tuple(
            build(
                partition_cls,
                error_code=ErrorCode.none,
                partition_index=p.index,
                leader_id=node,
                leader_epoch=LEADER_EPOCH,
                replica_nodes=(node,),
                isr_nodes=(node,),
                offline_replicas=(),
            )
            for p in topic.partitions
        )
        return build(
            topic_cls,
            error_code=ErrorCode.none,
            name=topic.name,
            topic_id=topic.topic_id,
            is_internal=False,
            partitions=partitions,
        )

    def failed(name: str | None, error: ErrorCode, topic_id: Any = None) -> Any:
        return build(
            topic_cls,
            error_code=error,
            name=name,
            topic_id=topic_id,
            is_internal=False,
            partitions=(),
        )

    return describe, failed


def _describable(session: Any, topics: Iterable[Topic]) -> list[Topic]:
    return auth.filter_authorized(session, auth.DESCRIBE, auth.TOPIC, topics, lambda t: t.name)


def _may_create(session: Any, name: str) -> bool:
    """CREATE on the Cluster, or on the topic (Kafka's rule for auto-creation)."""
    cluster = auth.authorize(session, auth.CREATE, auth.CLUSTER, log_if_denied=False)
    return cluster or auth.authorize(session, auth.CREATE, auth.TOPIC, name)


def _legal(name: str) -> bool:
    try:
        validate_topic_name(name)
    except TopicError:
        return False
    return True


def _describe_wanted(
    ctx: AdminContext,
    requested: Any,
    describe: Callable[..., Any],
    failed: Callable[..., Any],
    created: dict[str, Topic],
    session: Any = None,
    auto: bool = False,
) -> Generator[None, None, list[Any]]:
    out = []
    for wanted in requested:
        yield
        name = wanted.name
        if name is None:
            topic = ctx.topics.by_id(wanted.topic_id)
            if topic is not None and not _describable(session, [topic]):
                out.append(failed(None, ErrorCode.topic_authorization_failed, wanted.topic_id))
                continue
            out.append(
                describe(topic)
                if topic
                else failed(None, ErrorCode.unknown_topic_id, wanted.topic_id)
            )
            continue
        topic = ctx.topics.get(name) or created.get(name)
        if not auth.authorize(session, auth.DESCRIBE, auth.TOPIC, name) or (
            topic is None and auto and _legal(name) and not _may_create(session, name)
        ):
            out.append(failed(name, ErrorCode.topic_authorization_failed))
            continue
        if topic is None and not _legal(name):
            out.append(failed(name, ErrorCode.invalid_topic_exception))
            continue
        out.append(describe(topic) if topic else failed(name, ErrorCode.unknown_topic_or_partition))
    return out


def _metadata_response(ctx: AdminContext, request: Request, cls: type, topics: list[Any]) -> Work:
    node = ctx.node.node_id
    session = request.session
    cluster_operations = auth.NOT_REQUESTED
    if getattr(request.body, "include_cluster_authorized_operations", False):  # v8 to v10
        may_describe = auth.authorize(session, auth.DESCRIBE, auth.CLUSTER, log_if_denied=False)
        cluster_operations = (
            auth.authorized_operations(session, auth.CLUSTER) if may_describe else 0
        )
    if getattr(request.body, "include_topic_authorized_operations", False):
        for i, topic in enumerate(topics):
            topics[i] = _with_operations(session, topic)
            yield
    return build(
        cls,
        throttle_time=datetime.timedelta(0),
        brokers=(broker_entity(ctx, sibling(cls, "MetadataResponseBroker"), request),),
        cluster_id=ctx.node.cluster_id,
        controller_id=node,
        topics=tuple(topics),
        cluster_authorized_operations=cluster_operations,
    )


# Answers about no topic the principal may describe by name: their operations stay unasked.
_NOT_DESCRIBED = (
    ErrorCode.topic_authorization_failed, ErrorCode.unknown_topic_id, ErrorCode.invalid_request
)  # fmt: skip


def _with_operations(session: Any, topic: Any) -> Any:
    """The topic's authorized operations, as Kafka sets them on the topics it describes (found,
    unknown or invalid names alike; not the refused ones, nor unknown topic ids)."""
    if topic.name is None or topic.error_code in _NOT_DESCRIBED:
        return topic
    operations = auth.authorized_operations(session, auth.TOPIC, topic.name)
    return dataclasses.replace(topic, topic_authorized_operations=operations)
