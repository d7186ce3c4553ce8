"""Metadata (3): one broker that leads every partition; topics auto-created when allowed."""

from __future__ import annotations

import datetime
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.dispatch import api
from onceflow.broker.topics import Topic, TopicError, validate_topic_name
from onceflow.protocol.entities import build, sibling
from onceflow.protocol.messages import response_type

if TYPE_CHECKING:
    from onceflow.broker.server import Broker
    from onceflow.protocol.messages import Request

log = logging.getLogger(__name__)

LEADER_EPOCH = 0  # a single node is leader of everything forever


def broker_entity(broker: Broker, cls: type) -> Any:
    return build(
        cls,
        node_id=broker.config.node_id,
        host=broker.config.advertised,
        port=broker.port,
        rack=None,
    )


def auto_create(broker: Broker, name: str) -> Topic | None:
    """Create a topic with the broker defaults, or None when auto-creation is off or fails."""
    if not broker.config.auto_create_topics_enable:
        return None
    try:
        topic = broker.topics.create(name, broker.config.num_partitions)
    except TopicError as e:
        log.info("auto-creation of %r refused: %s", name, e)
        return None
    log.info("auto-created topic %r with %d partition(s)", name, len(topic.partitions))
    return topic


@api(3, 0, 12)
def handle_metadata(broker: Broker, request: Request) -> Any:
    req = request.body
    cls = response_type(3, request.api_version)
    topic_cls = sibling(cls, "MetadataResponseTopic")
    partition_cls = sibling(cls, "MetadataResponsePartition")
    node = broker.config.node_id

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

    requested = req.topics
    if request.api_version == 0 and not requested:
        requested = None  # v0: an empty list means every topic
    allow_auto = getattr(req, "allow_auto_topic_creation", True)
    if requested is None:
        topics = tuple(describe(t) for t in broker.topics)
    elif request.api_version < 12 and any(
        t.name is None or getattr(t, "topic_id", None) is not None for t in requested
    ):
        # Topic ids are only for v12+ (names are not nullable before): Kafka refuses the request
        # with INVALID_REQUEST on every topic, a missing name answered as "".
        topics = tuple(
            failed(t.name or "", ErrorCode.invalid_request, getattr(t, "topic_id", None))
            for t in requested
        )
    else:
        out = []
        for wanted in requested:
            name = wanted.name
            if name is None:
                topic = broker.topics.by_id(wanted.topic_id)
                out.append(
                    describe(topic)
                    if topic
                    else failed(None, ErrorCode.unknown_topic_id, wanted.topic_id)
                )
                continue
            topic = broker.topics.get(name)
            if topic is None:
                try:
                    validate_topic_name(name)
                except TopicError:
                    out.append(failed(name, ErrorCode.invalid_topic_exception))
                    continue
                topic = auto_create(broker, name) if allow_auto else None
            out.append(
                describe(topic) if topic else failed(name, ErrorCode.unknown_topic_or_partition)
            )
        topics = tuple(out)
    return build(
        cls,
        throttle_time=datetime.timedelta(0),
        brokers=(broker_entity(broker, sibling(cls, "MetadataResponseBroker")),),
        cluster_id=broker.cluster_id,
        controller_id=node,
        topics=topics,
        cluster_authorized_operations=-2147483648,
    )
