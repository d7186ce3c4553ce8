"""AlterConfigs (33) and IncrementalAlterConfigs (44): change topic configs, as Kafka does.

Each resource is answered on its own (Kafka's ConfigAdminManager.preprocess, then the
controller's ConfigurationControlManager): a resource named twice is INVALID_REQUEST for both
entries, a config key named twice or a null value INVALID_REQUEST, an unknown resource type
INVALID_REQUEST, a topic that does not exist UNKNOWN_TOPIC_OR_PARTITION, a value Kafka refuses
INVALID_CONFIG. AlterConfigs replaces a topic's whole set of overrides; IncrementalAlterConfigs
applies SET / DELETE / APPEND / SUBTRACT (the last two on LIST settings only, cleanup.policy).
Valid topic changes are written durably in topics.json before the answer, then applied to the
live partitions. Broker settings are static here (read at start), so any change to a BROKER
resource is INVALID_REQUEST, as Kafka answers a static setting ("Cannot update these configs
dynamically").
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers.configs import BROKER, BROKER_LOGGER, TOPIC, resource_result
from onceflow.broker.handlers.context import AdminContext
from onceflow.broker.handlers.responses import response_classes
from onceflow.broker.handlers.slices import SLICED_ABOVE, Work, in_slices, run_now, run_sliced
from onceflow.broker.handlers.topics_admin import topic_error_code
from onceflow.broker.topics import (
    ConfigUpdate,
    InvalidConfigError,
    TopicError,
    UnknownTopicError,
    check_legal_topic_name,
)
from onceflow.protocol.entities import build
from onceflow.security import authorization as auth

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request


SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
_OP_NAMES = {SET: "SET", DELETE: "DELETE", APPEND: "APPEND", SUBTRACT: "SUBTRACT"}
# Topic settings of Kafka's LIST type: the only ones APPEND and SUBTRACT apply to.
_LIST_SETTINGS = frozenset(
    {
        "cleanup.policy",
        "follower.replication.throttled.replicas",
        "leader.replication.throttled.replicas",
    }
)
# Names quoted in one error message: a request may name a million configs, the answer not.
_MAX_NAMES_IN_MESSAGE = 10

Outcome = tuple[ErrorCode, str | None]


class ResourceError(Exception):
    """One resource's refusal, answered with its Kafka error code."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def handle_alter_configs(ctx: AdminContext, request: Request) -> Any:
    sliced = len(request.body.resources) > SLICED_ABOVE
    return in_slices(_alter(ctx, request, False, sliced), len(request.body.resources))


def handle_incremental(ctx: AdminContext, request: Request) -> Any:
    sliced = len(request.body.resources) > SLICED_ABOVE
    return in_slices(_alter(ctx, request, True, sliced), len(request.body.resources))


def _alter(ctx: AdminContext, request: Request, incremental: bool, sliced: bool) -> Work:
    """One step per resource named (25,000 held the event loop 1.3 s at once); the topics'
    changes are then written together, as before."""
    req = request.body
    resources = list(req.resources)
    outcomes: list[Outcome | None] = [None] * len(resources)
    seen: dict[tuple[int, str], int] = {}
    for i, resource in enumerate(resources):
        key = (resource.resource_type, resource.resource_name)
        if key in seen:
            # Kafka refuses every entry of a resource named twice, the first one included.
            for j in (seen[key], i):
                outcomes[j] = (ErrorCode.invalid_request, "Each resource must appear at most once.")
        seen[key] = i
        yield
    defaults = ctx.topics.effective_configs({}) if incremental else {}
    updates: dict[str, ConfigUpdate] = {}
    topic_index: dict[str, int] = {}
    for i, resource in enumerate(resources):
        yield
        if outcomes[i] is not None:
            continue
        if not _may_alter(request, resource):
            outcomes[i] = (_refusal(resource), None)
            continue
        try:
            update = _check_resource(ctx, resource, incremental, defaults)
        except ResourceError as e:
            outcomes[i] = (e.code, str(e))
            continue
        if update is not None and ctx.topics.get(resource.resource_name) is None:
            # Answered here, in its step: the topics' change then sees only existing topics.
            outcomes[i] = _topic_outcome(absent_topic_error(resource.resource_name))
            continue
        if update is None:
            outcomes[i] = (ErrorCode.none, None)
        else:
            updates[resource.resource_name] = update
            topic_index[resource.resource_name] = i
    if not updates:
        return (yield from _response(request, resources, outcomes))
    return _alter_topics(ctx, request, resources, outcomes, updates, topic_index, sliced)


def _may_alter(request: Request, resource: Any) -> bool:
    """ALTER_CONFIGS on the topic, or on the Cluster for the broker's own resources."""
    if resource.resource_type == TOPIC:
        return auth.authorize(
            request.session, auth.ALTER_CONFIGS, auth.TOPIC, resource.resource_name
        )
    if resource.resource_type in (BROKER, BROKER_LOGGER):
        return auth.authorize_cluster(request.session, auth.ALTER_CONFIGS)
    return True  # answered INVALID_REQUEST by the checks


def _refusal(resource: Any) -> ErrorCode:
    return auth.failed(auth.TOPIC if resource.resource_type == TOPIC else auth.CLUSTER)


async def _alter_topics(
    ctx: AdminContext,
    request: Request,
    resources: list[Any],
    outcomes: list[Outcome | None],
    updates: dict[str, ConfigUpdate],
    topic_index: dict[str, int],
    sliced: bool,
) -> Any:
    results = await ctx.topics.alter_configs(updates, validate_only=request.body.validate_only)
    for name, error in results.items():
        outcomes[topic_index[name]] = _topic_outcome(error)
    response = _response(request, resources, outcomes)
    return await run_sliced(response) if sliced else run_now(response)


def absent_topic_error(name: str) -> TopicError:
    """What changing the configs of a topic that does not exist fails with (topics.py)."""
    try:
        check_legal_topic_name(name)
    except TopicError as e:
        return e
    return UnknownTopicError(f"The topic '{name}' does not exist.")


def _topic_outcome(error: TopicError | None) -> Outcome:
    if error is None:
        return ErrorCode.none, None
    return topic_error_code(error), str(error)


def _check_resource(
    ctx: AdminContext, resource: Any, incremental: bool, defaults: dict[str, str]
) -> ConfigUpdate | None:
    """The checks Kafka makes before touching anything; returns the topic's update, or None
    when there is nothing to change (an empty BROKER resource). `defaults`: the topics'
    effective settings without overrides (IncrementalAlterConfigs' APPEND starts from them)."""
    configs = list(resource.configs)
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise ResourceError(ErrorCode.invalid_request, "Error due to duplicate config keys")
    nulls = [
        c.name
        for c in configs
        if c.value is None and not (incremental and c.config_operation == DELETE)
    ]
    if nulls:
        raise ResourceError(
            ErrorCode.invalid_request, f"Null value not supported for : {_quote(nulls)}"
        )
    if incremental:
        unknown = [c.config_operation for c in configs if c.config_operation not in _OP_NAMES]
        if unknown:
            raise ResourceError(ErrorCode.invalid_request, f"Unknown operations type {unknown[0]}")
    if resource.resource_type == BROKER:
        _check_broker_resource(ctx, resource.resource_name, names)
        return None
    if resource.resource_type != TOPIC:
        # BROKER_LOGGER (log4j levels), CLIENT_METRICS and GROUP configs do not exist here.
        raise ResourceError(
            ErrorCode.invalid_request, f"Unknown resource type {resource.resource_type}"
        )
    if not resource.resource_name:
        raise ResourceError(ErrorCode.invalid_request, "Default topic resources are not allowed.")
    if incremental:
        ops = [(c.name, c.config_operation, c.value) for c in configs]
        return lambda current: apply_operations(current, ops, defaults)
    whole = {c.name: c.value for c in configs}
    return lambda current: whole


def _check_broker_resource(ctx: AdminContext, name: str, config_names: list[str]) -> None:
    if name:
        try:
            node_id = int(name)
        except ValueError:
            raise ResourceError(
                ErrorCode.invalid_request, f"Node id must be an integer, but it is: {name}"
            ) from None
        if node_id != ctx.config.node_id:
            raise ResourceError(
                ErrorCode.invalid_request,
                f"Unexpected broker id, expected {ctx.config.node_id}, but received {name}",
            )
    if config_names:
        # Kafka's DynamicBrokerConfig refuses static settings with a ConfigException, which
        # ConfigAdminManager answers as INVALID_REQUEST; every onceflow setting is static.
        raise ResourceError(
            ErrorCode.invalid_request,
            f"Cannot update these configs dynamically: {_quote(config_names)} "
            "(broker settings are read at start: set them in the config file or flags)",
        )


def apply_operations(
    current: dict[str, str],
    ops: list[tuple[str, int, str | None]],
    defaults: dict[str, str],
) -> dict[str, str]:
    """A topic's overrides after IncrementalAlterConfigs' operations, as Kafka's
    ConfigurationControlManager applies them (the result is validated by the caller)."""
    configs = dict(current)
    for name, op, value in ops:
        if op == SET:
            assert value is not None  # null values were refused before
            configs[name] = value
        elif op == DELETE:
            configs.pop(name, None)
        else:
            if name not in _LIST_SETTINGS:
                raise InvalidConfigError(
                    f"Can't {_OP_NAMES[op]} to key {name} because its type is not LIST."
                )
            assert value is not None
            # Kafka splits on ',' alone and drops empty parts; unset means the default.
            parts = [p for p in configs.get(name, defaults.get(name, "")).split(",") if p]
            for item in _java_split(value):
                if op == APPEND and item not in parts:
                    parts.append(item)
                elif op == SUBTRACT and item in parts:
                    parts.remove(item)
            configs[name] = ",".join(parts)
    return configs


def _java_split(value: str) -> list[str]:
    """String.split(","): trailing empty strings are dropped."""
    parts = value.split(",")
    while parts and not parts[-1]:
        parts.pop()
    return parts


def _quote(names: list[str]) -> str:
    shown = ", ".join(names[:_MAX_NAMES_IN_MESSAGE])
    more = len(names) - _MAX_NAMES_IN_MESSAGE
    return shown + (f" and {more} more" if more > 0 else "")


def _response(request: Request, resources: list[Any], outcomes: list[Outcome | None]) -> Work:
    cls, entry_cls = response_classes(request, "AlterConfigsResourceResponse")
    entries = []
    for resource, outcome in zip(resources, outcomes, strict=True):
        assert outcome is not None
        entries.append(resource_result(entry_cls, resource, *outcome))
        yield
    return build(cls, throttle_time=datetime.timedelta(0), responses=tuple(entries))
