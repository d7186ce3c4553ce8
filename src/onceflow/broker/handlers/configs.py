"""DescribeConfigs (32): topic-level and broker-level settings, with their sources."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.dispatch import api
from onceflow.protocol.entities import build, sibling
from onceflow.protocol.messages import response_type
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.broker.server import Broker
    from onceflow.protocol.messages import Request

TOPIC = 2
BROKER = 4
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5


@api(32, 1, 4)
def handle_describe_configs(broker: Broker, request: Request) -> Any:
    req = request.body
    cls = response_type(32, request.api_version)
    result_cls = sibling(cls, "DescribeConfigsResult")
    entry_cls = sibling(cls, "DescribeConfigsResourceResult")
    results = []
    for resource in req.resources:
        error, message = ErrorCode.none, None
        entries: dict[str, tuple[str, int]] = {}
        resource_type = auth.TOPIC if resource.resource_type == TOPIC else auth.CLUSTER
        name = resource.resource_name if resource_type == auth.TOPIC else auth.CLUSTER_NAME
        if resource.resource_type in (TOPIC, BROKER) and not auth.authorize(
            request.session, auth.DESCRIBE_CONFIGS, resource_type, name
        ):
            error = auth.failed(resource_type)
        elif resource.resource_type == TOPIC:
            topic = broker.topics.get(resource.resource_name)
            if topic is None:
                error = ErrorCode.unknown_topic_or_partition
                message = f"topic {resource.resource_name!r} does not exist"
            else:
                set_on_broker = broker.topics.topic_defaults_set_on_broker()
                for k, v in broker.topics.effective_configs(topic.configs).items():
                    if k in topic.configs:
                        entries[k] = (v, DYNAMIC_TOPIC_CONFIG)
                    elif k in set_on_broker:
                        entries[k] = (v, STATIC_BROKER_CONFIG)
                    else:
                        entries[k] = (v, DEFAULT_CONFIG)
        elif resource.resource_type == BROKER:
            if resource.resource_name not in ("", str(broker.config.node_id)):
                error, message = ErrorCode.invalid_request, "unknown broker id"
            else:
                entries = {
                    k: (v, STATIC_BROKER_CONFIG) for k, v in broker.config.kafka_settings().items()
                }
        else:
            error = ErrorCode.invalid_request
            message = f"resource type {resource.resource_type} is not supported"
        keys = resource.configuration_keys
        configs = tuple(
            build(
                entry_cls,
                name=k,
                value=v,
                read_only=resource.resource_type == BROKER,
                config_source=source,
                is_default=source == DEFAULT_CONFIG,
                is_sensitive=False,
                synonyms=(),
                config_type=0,
                documentation=None,
            )
            for k, (v, source) in sorted(entries.items())
            if not keys or k in keys
        )
        results.append(
            build(
                result_cls,
                error_code=error,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                configs=configs,
            )
        )
    return build(cls, throttle_time=datetime.timedelta(0), results=tuple(results))
