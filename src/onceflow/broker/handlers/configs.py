"""DescribeConfigs (32): topic-level and broker-level settings, with their sources."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers.context import AdminContext
from onceflow.broker.handlers.responses import response_classes
from onceflow.broker.handlers.slices import Work, in_slices
from onceflow.protocol.entities import build, sibling
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request

TOPIC = 2
BROKER = 4
BROKER_LOGGER = 8
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5


def resource_result(
    cls: type, resource: Any, error: ErrorCode, message: str | None, **values: Any
) -> Any:
    """A config API's answer for one resource: the resource as the request named it, and its
    error (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs)."""
    return build(
        cls,
        error_code=error,
        error_message=message,
        resource_type=resource.resource_type,
        resource_name=resource.resource_name,
        **values,
    )


def topic_synonyms(
    ctx: AdminContext, name: str, overrides: dict[str, str]
) -> list[tuple[str, str, int]]:
    """A topic config's synonyms as Kafka lists them, most specific first: the topic's own
    value, then the broker setting it defaults to (set on the broker, or Kafka's default)."""
    found = []
    if name in overrides:
        found.append((name, overrides[name], DYNAMIC_TOPIC_CONFIG))
    broker = ctx.topics.broker_synonym(name)
    if broker is not None:
        broker_name, value, set_on_broker = broker
        found.append(
            (broker_name, value, STATIC_BROKER_CONFIG if set_on_broker else DEFAULT_CONFIG)
        )
    return found


def handle_describe_configs(ctx: AdminContext, request: Request) -> Any:
    return in_slices(_describe_configs(ctx, request), len(request.body.resources))


def _describe_configs(ctx: AdminContext, request: Request) -> Work:
    """One step per resource named (2,500 of one topic held the event loop 1.3 s at once)."""
    cls, result_cls, entry_cls = response_classes(
        request, "DescribeConfigsResult", "DescribeConfigsResourceResult"
    )
    results = []
    for resource in request.body.resources:
        error, message = ErrorCode.none, None
        entries: dict[str, tuple[str, int]] = {}
        synonyms: dict[str, list[tuple[str, str, int]]] = {}  # (name, value, source), Kafka's order
        resource_type = auth.TOPIC if resource.resource_type == TOPIC else auth.CLUSTER
        name = resource.resource_name if resource_type == auth.TOPIC else auth.CLUSTER_NAME
        if resource.resource_type in (TOPIC, BROKER) and not auth.authorize(
            request.session, auth.DESCRIBE_CONFIGS, resource_type, name
        ):
            error = auth.failed(resource_type)
        elif resource.resource_type == TOPIC:
            topic = ctx.topics.get(resource.resource_name)
            if topic is None:
                error = ErrorCode.unknown_topic_or_partition
                message = f"topic {resource.resource_name!r} does not exist"
            else:
                set_on_broker = ctx.topics.topic_defaults_set_on_broker()
                for k, v in ctx.topics.effective_configs(topic.configs).items():
                    if k in topic.configs:
                        entries[k] = (v, DYNAMIC_TOPIC_CONFIG)
                    elif k in set_on_broker:
                        entries[k] = (v, STATIC_BROKER_CONFIG)
                    else:
                        entries[k] = (v, DEFAULT_CONFIG)
                    synonyms[k] = topic_synonyms(ctx, k, topic.configs)
        elif resource.resource_type == BROKER:
            if resource.resource_name not in ("", str(ctx.config.node_id)):
                error, message = ErrorCode.invalid_request, "unknown broker id"
            else:
                entries = {
                    k: (v, STATIC_BROKER_CONFIG) for k, v in ctx.config.kafka_settings().items()
                }
                synonyms = {k: [(k, v, STATIC_BROKER_CONFIG)] for k, (v, _) in entries.items()}
        else:
            error = ErrorCode.invalid_request
            message = f"resource type {resource.resource_type} is not supported"
        keys = resource.configuration_keys
        synonym_cls = sibling(cls, "DescribeConfigsSynonym")
        configs = tuple(
            build(
                entry_cls,
                name=k,
                value=v,
                read_only=resource.resource_type == BROKER,
                config_source=source,
                is_default=source == DEFAULT_CONFIG,
                is_sensitive=False,
                synonyms=tuple(
                    build(synonym_cls, name=n, value=value, source=source)
                    for n, value, source in synonyms.get(k, ())
                )
                if request.body.include_synonyms
                else (),
                config_type=0,
                documentation=None,
            )
            for k, (v, source) in sorted(entries.items())
            if not keys or k in keys
        )
        results.append(resource_result(result_cls, resource, error, message, configs=configs))
        yield
    return build(cls, throttle_time=datetime.timedelta(0), results=tuple(results))
