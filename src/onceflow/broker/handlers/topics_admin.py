"""CreateTopics (19), DeleteTopics (20), CreatePartitions (37)."""

from __future__ import annotations

import datetime
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers.context import AdminContext
from onceflow.broker.handlers.responses import response_class
from onceflow.broker.topics import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationError,
    InvalidTopicError,
    NewTopic,
    Topic,
    TopicError,
    TopicExistsError,
    TopicStorageError,
    UnknownTopicError,
    UnknownTopicIdError,
)
from onceflow.protocol.entities import build, sibling
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request

log = logging.getLogger(__name__)


class InvalidReplicaAssignmentError(TopicError):
    """A manual assignment Kafka refuses (INVALID_REPLICA_ASSIGNMENT)."""


class TopicAuthorizationError(TopicError):
    """The principal may not do this to this topic (TOPIC_AUTHORIZATION_FAILED)."""

    def __init__(self) -> None:
        super().__init__("Authorization failed.")  # Kafka's message


def _check_authorized(request: Request, operation: Any, name: str) -> None:
    if not auth.authorize(request.session, operation, auth.TOPIC, name):
        raise TopicAuthorizationError


_TOPIC_ERRORS: dict[type[TopicError], ErrorCode] = {
    TopicAuthorizationError: ErrorCode.topic_authorization_failed,
    TopicExistsError: ErrorCode.topic_already_exists,
    InvalidTopicError: ErrorCode.invalid_topic_exception,
    UnknownTopicError: ErrorCode.unknown_topic_or_partition,
    InvalidPartitionsError: ErrorCode.invalid_partitions,
    InvalidConfigError: ErrorCode.invalid_config,
    InvalidReplicationError: ErrorCode.invalid_replication_factor,
    InvalidReplicaAssignmentError: ErrorCode.invalid_replica_assignment,
    TopicStorageError: ErrorCode.kafka_storage_error,
    UnknownTopicIdError: ErrorCode.unknown_topic_id,
}


def topic_error_code(error: TopicError) -> ErrorCode:
    return _TOPIC_ERRORS.get(type(error), ErrorCode.unknown_server_error)


def _check_replicas(ctx: AdminContext, broker_ids: Any) -> None:
    if tuple(broker_ids) != (ctx.config.node_id,):
        raise InvalidReplicaAssignmentError(
            f"The manual partition assignment {list(broker_ids)} is not [{ctx.config.node_id}]: "
            f"only broker {ctx.config.node_id} exists"
        )


def _partition_count(ctx: AdminContext, topic: Any) -> int:
    if topic.assignments:
        if topic.replication_factor != -1:
            raise InvalidReplicationError(
                "A manual partition assignment was specified, but replication factor was not "
                "set to -1."
            )
        if topic.num_partitions != -1:
            raise InvalidPartitionsError(
                "A manual partition assignment was specified, but numPartitions was not set to -1."
            )
        for assignment in topic.assignments:
            _check_replicas(ctx, assignment.broker_ids)
        indexes = sorted(a.partition_index for a in topic.assignments)
        if indexes != list(range(len(indexes))):
            raise InvalidReplicaAssignmentError(
                "partitions should be a consecutive 0-based integer sequence"
            )
        return len(topic.assignments)
    if topic.replication_factor == 0 or topic.replication_factor < -1:
        raise InvalidReplicationError(
            "Replication factor must be larger than 0, or -1 to use the default value."
        )
    if topic.replication_factor not in (-1, 1):
        # KRaft's message (ReplicationControlManager around StripedReplicaPlacer's).
        raise InvalidReplicationError(
            f"Unable to replicate the partition {topic.replication_factor} time(s): The target "
            f"replication factor of {topic.replication_factor} cannot be reached because only "
            "1 broker(s) are registered."
        )
    return ctx.config.num_partitions if topic.num_partitions == -1 else topic.num_partitions


def handle_create_topics(ctx: AdminContext, request: Request) -> Any:
    """Checks that need no state now; the rest, and the files, in one registry change."""
    req = request.body
    outcomes: list[TopicError | NewTopic] = []
    seen: set[str] = set()
    # CREATE on the Cluster, or on each topic.
    cluster = auth.authorize(request.session, auth.CREATE, auth.CLUSTER, log_if_denied=False)
    for t in req.topics:
        configs = {c.name: c.value for c in t.configs if c.value is not None}
        try:
            if not cluster:
                _check_authorized(request, auth.CREATE, t.name)
            if t.name in seen:
                raise InvalidTopicError(f"topic {t.name!r} appears twice in the request")
            seen.add(t.name)
            count = _partition_count(ctx, t)
            if req.validate_only:
                ctx.topics.validate_new(t.name, count, configs)
            outcomes.append(NewTopic(t.name, count, configs))
        except TopicError as e:
            outcomes.append(e)
    wanted = [o for o in outcomes if isinstance(o, NewTopic)]
    if req.validate_only or not wanted:
        return _create_topics_response(ctx, request, outcomes, {})
    return _create_topics_later(ctx, request, outcomes, wanted)


async def _create_topics_later(
    ctx: AdminContext,
    request: Request,
    outcomes: list[TopicError | NewTopic],
    wanted: list[NewTopic],
) -> Any:
    created = await ctx.topics.create_topics(wanted)
    for new, result in zip(wanted, created, strict=True):
        if isinstance(result, Topic):
            log.info("created topic %r with %d partition(s)", new.name, new.num_partitions)
    return _create_topics_response(
        ctx, request, outcomes, {new.name: r for new, r in zip(wanted, created, strict=True)}
    )


def _create_topics_response(
    ctx: AdminContext,
    request: Request,
    outcomes: list[TopicError | NewTopic],
    created: dict[str, Topic | TopicError],
) -> Any:
    cls = response_class(request)
    result_cls = sibling(cls, "CreatableTopicResult")
    config_cls = sibling(cls, "CreatableTopicConfigs") if request.api_version >= 5 else None
    results = []
    for t, outcome in zip(request.body.topics, outcomes, strict=True):
        error, message, topic_id, count, configs_out = ErrorCode.none, None, None, -1, None
        config_error = ErrorCode.none
        result = created.get(t.name, outcome) if isinstance(outcome, NewTopic) else outcome
        if isinstance(result, TopicError):
            error, message = topic_error_code(result), str(result)
        else:
            assert isinstance(outcome, NewTopic)
            count = outcome.num_partitions
            if isinstance(result, Topic):
                topic_id = result.topic_id
            if config_cls is not None and not auth.authorize(
                request.session, auth.DESCRIBE_CONFIGS, auth.TOPIC, t.name, log_if_denied=False
            ):
                config_error = ErrorCode.topic_authorization_failed
            elif config_cls is not None:
                effective = ctx.topics.effective_configs(outcome.configs)
                configs_out = tuple(
                    build(
                        config_cls,
                        name=k,
                        value=v,
                        read_only=False,
                        config_source=1 if k in outcome.configs else 5,
                        is_sensitive=False,
                    )
                    for k, v in sorted(effective.items())
                )
        results.append(
            build(
                result_cls,
                name=t.name,
                topic_id=topic_id,
                error_code=error,
                error_message=message,
                topic_config_error_code=config_error,
                num_partitions=count,
                replication_factor=1 if error == ErrorCode.none else -1,
                configs=configs_out,
            )
        )
    return build(cls, throttle_time=datetime.timedelta(0), topics=tuple(results))


def handle_delete_topics(ctx: AdminContext, request: Request) -> Any:
    req = request.body
    if request.api_version >= 6:
        wanted = [(t.name, t.topic_id) for t in req.topics]
    else:
        wanted = [(name, None) for name in req.topic_names]
    return _delete_topics_later(ctx, request, wanted)


async def _delete_topics_later(
    ctx: AdminContext, request: Request, wanted: list[tuple[str | None, Any]]
) -> Any:
    cls = response_class(request)
    result_cls = sibling(cls, "DeletableTopicResult")
    refused = [not _may_delete(ctx, request, name, topic_id) for name, topic_id in wanted]
    # An id is resolved inside the change, so it names the topic as it is then.
    deleted = iter(
        await ctx.topics.delete_topics(
            [
                name if name is not None else topic_id
                for (name, topic_id), no in zip(wanted, refused, strict=True)
                if not no
            ]
        )
    )
    results = []
    for (name, topic_id), no in zip(wanted, refused, strict=True):
        result = TopicAuthorizationError() if no else next(deleted)
        error, message = ErrorCode.none, None
        if isinstance(result, TopicError):
            error, message = topic_error_code(result), str(result)
            if isinstance(result, UnknownTopicIdError):
                message = None
        else:
            name, topic_id = result.name, result.topic_id
            log.info("deleted topic %r", name)
        results.append(
            build(result_cls, name=name, topic_id=topic_id, error_code=error, error_message=message)
        )
    return build(cls, throttle_time=datetime.timedelta(0), responses=tuple(results))


def _may_delete(ctx: AdminContext, request: Request, name: str | None, topic_id: Any) -> bool:
    """DELETE on the topic; a topic named by an unknown id is left to answer UNKNOWN_TOPIC_ID."""
    if name is None:
        topic = ctx.topics.by_id(topic_id)
        if topic is None:
            return True
        name = topic.name
    return auth.authorize(request.session, auth.DELETE, auth.TOPIC, name)


def handle_create_partitions(ctx: AdminContext, request: Request) -> Any:
    return _create_partitions_later(ctx, request)


async def _create_partitions_later(ctx: AdminContext, request: Request) -> Any:
    req = request.body
    cls = response_class(request)
    result_cls = sibling(cls, "CreatePartitionsTopicResult")
    results = []
    for t in req.topics:
        error, message = ErrorCode.none, None
        try:
            _check_authorized(request, auth.ALTER, t.name)
            topic = ctx.topics.get(t.name)
            if topic is None:
                raise UnknownTopicError(f"topic {t.name!r} does not exist")
            if t.count <= len(topic.partitions):
                raise InvalidPartitionsError(
                    f"Topic currently has {len(topic.partitions)} partitions, which is higher "
                    f"than or equal to the requested {t.count}."
                )
            if t.assignments and len(t.assignments) != t.count - len(topic.partitions):
                raise InvalidReplicaAssignmentError(
                    f"Increasing the number of partitions by {t.count - len(topic.partitions)} "
                    f"but {len(t.assignments)} assignments provided."
                )
            for assignment in t.assignments or ():
                _check_replicas(ctx, assignment.broker_ids)
            if not req.validate_only:
                # Checked again inside the change: another request may have run meanwhile.
                await ctx.topics.add_partitions(t.name, t.count)
                log.info("topic %r now has %d partitions", t.name, t.count)
        except TopicError as e:
            error, message = topic_error_code(e), str(e)
        results.append(build(result_cls, name=t.name, error_code=error, error_message=message))
    return build(cls, throttle_time=datetime.timedelta(0), results=tuple(results))
