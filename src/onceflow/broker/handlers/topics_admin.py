"""CreateTopics (19), DeleteTopics (20), CreatePartitions (37)."""

from __future__ import annotations

import datetime
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.dispatch import api
from onceflow.broker.topics import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationError,
    InvalidTopicError,
    TopicError,
    TopicExistsError,
    UnknownTopicError,
)
from onceflow.protocol.entities import build, sibling
from onceflow.protocol.messages import response_type

if TYPE_CHECKING:
    from onceflow.broker.server import Broker
    from onceflow.protocol.messages import Request

log = logging.getLogger(__name__)


class InvalidReplicaAssignmentError(TopicError):
    """A manual assignment Kafka refuses (INVALID_REPLICA_ASSIGNMENT)."""


_TOPIC_ERRORS: dict[type[TopicError], ErrorCode] = {
    TopicExistsError: ErrorCode.topic_already_exists,
    InvalidTopicError: ErrorCode.invalid_topic_exception,
    UnknownTopicError: ErrorCode.unknown_topic_or_partition,
    InvalidPartitionsError: ErrorCode.invalid_partitions,
    InvalidConfigError: ErrorCode.invalid_config,
    InvalidReplicationError: ErrorCode.invalid_replication_factor,
    InvalidReplicaAssignmentError: ErrorCode.invalid_replica_assignment,
}


def topic_error_code(error: TopicError) -> ErrorCode:
    return _TOPIC_ERRORS.get(type(error), ErrorCode.unknown_server_error)


def _check_replicas(broker: Broker, broker_ids: Any) -> None:
    if tuple(broker_ids) != (broker.config.node_id,):
        raise InvalidReplicaAssignmentError(
            f"The manual partition assignment {list(broker_ids)} is not [{broker.config.node_id}]: "
            f"only broker {broker.config.node_id} exists"
        )


def _partition_count(broker: Broker, topic: Any) -> int:
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
            _check_replicas(broker, assignment.broker_ids)
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
        raise InvalidReplicationError(
            f"Replication factor: {topic.replication_factor} larger than available brokers: 1."
        )
    return broker.config.num_partitions if topic.num_partitions == -1 else topic.num_partitions


@api(19, 2, 7)
def handle_create_topics(broker: Broker, request: Request) -> Any:
    req = request.body
    cls = response_type(19, request.api_version)
    result_cls = sibling(cls, "CreatableTopicResult")
    config_cls = sibling(cls, "CreatableTopicConfigs") if request.api_version >= 5 else None
    results = []
    seen: set[str] = set()
    for t in req.topics:
        error, message, topic_id, count, configs_out = ErrorCode.none, None, None, -1, None
        configs = {c.name: c.value for c in t.configs if c.value is not None}
        try:
            if t.name in seen:
                raise InvalidTopicError(f"topic {t.name!r} appears twice in the request")
            seen.add(t.name)
            count = _partition_count(broker, t)
            if req.validate_only:
                broker.topics.validate_new(t.name, count, configs)
            else:
                topic_id = broker.topics.create(t.name, count, configs).topic_id
                log.info("created topic %r with %d partition(s)", t.name, count)
            if config_cls is not None:
                effective = broker.topics.effective_configs(configs)
                configs_out = tuple(
                    build(
                        config_cls,
                        name=k,
                        value=v,
                        read_only=False,
                        config_source=1 if k in configs else 5,
                        is_sensitive=False,
                    )
                    for k, v in sorted(effective.items())
                )
        except TopicError as e:
            error, message, count = topic_error_code(e), str(e), -1
        results.append(
            build(
                result_cls,
                name=t.name,
                topic_id=topic_id,
                error_code=error,
                error_message=message,
                topic_config_error_code=0,
                num_partitions=count,
                replication_factor=1 if error == ErrorCode.none else -1,
                configs=configs_out,
            )
        )
    return build(cls, throttle_time=datetime.timedelta(0), topics=tuple(results))


@api(20, 1, 6)
def handle_delete_topics(broker: Broker, request: Request) -> Any:
    req = request.body
    cls = response_type(20, request.api_version)
    result_cls = sibling(cls, "DeletableTopicResult")
    if request.api_version >= 6:
        wanted = [(t.name, t.topic_id) for t in req.topics]
    else:
        wanted = [(name, None) for name in req.topic_names]
    results = []
    for name, topic_id in wanted:
        error, message = ErrorCode.none, None
        if name is None:
            topic = broker.topics.by_id(topic_id)
            if topic is None:
                results.append(
                    build(
                        result_cls,
                        name=None,
                        topic_id=topic_id,
                        error_code=ErrorCode.unknown_topic_id,
                        error_message=None,
                    )
                )
                continue
            name = topic.name
        try:
            deleted = broker.topics.delete(name)
            topic_id = deleted.topic_id
            log.info("deleted topic %r", name)
        except TopicError as e:
            error, message = topic_error_code(e), str(e)
        results.append(
            build(result_cls, name=name, topic_id=topic_id, error_code=error, error_message=message)
        )
    return build(cls, throttle_time=datetime.timedelta(0), responses=tuple(results))


@api(37, 0, 3)
def handle_create_partitions(broker: Broker, request: Request) -> Any:
    req = request.body
    cls = response_type(37, request.api_version)
    result_cls = sibling(cls, "CreatePartitionsTopicResult")
    results = []
    for t in req.topics:
        error, message = ErrorCode.none, None
        try:
            topic = broker.topics.get(t.name)
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
                _check_replicas(broker, assignment.broker_ids)
            if not req.validate_only:
                broker.topics.add_partitions(t.name, t.count)
                log.info("topic %r now has %d partitions", t.name, t.count)
        except TopicError as e:
            error, message = topic_error_code(e), str(e)
        results.append(build(result_cls, name=t.name, error_code=error, error_message=message))
    return build(cls, throttle_time=datetime.timedelta(0), results=tuple(results))
