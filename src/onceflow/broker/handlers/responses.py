"""Response building shared by the handlers: the response classes of a request, entities built
from the coordinators' result objects, per-partition entries grouped under their topics."""

from __future__ import annotations

import datetime
from collections.abc import Generator, Iterable
from dataclasses import fields
from functools import cache
from typing import TYPE_CHECKING, Any

from onceflow.protocol.entities import build, sibling
from onceflow.protocol.messages import response_type

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request

NO_THROTTLE = datetime.timedelta(0)


def response_class(request: Request) -> type:
    """The response entity of the request's API, at the request's version."""
    return response_type(request.api_key, request.api_version)


def response_classes(request: Request, *nested: str) -> tuple[type, ...]:
    """The response entity of the request, then the nested entity classes named."""
    cls = response_class(request)
    return (cls, *(sibling(cls, name) for name in nested))


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def build_from(cls: type, source: Any, **values: Any) -> Any:
    """An entity whose fields are `source`'s attributes of the same names (a coordinator's
    result object), with `values` for the fields it names otherwise. As `build`, the fields
    the entity's version lacks are left out."""
    taken = {
        name: getattr(source, name)
        for name in _field_names(cls)
        if name not in values and hasattr(source, name)
    }
    return build(cls, **taken, **values)


def by_topic(
    entries: Iterable[tuple[str, Any]], topic_cls: type, partitions: str = "partitions"
) -> tuple[Any, ...]:
    """(topic name, partition entity) pairs as topic entities holding their partitions (under
    the field `partitions`), topics in the order first met."""
    grouped: dict[str, list[Any]] = {}
    for topic, entry in entries:
        grouped.setdefault(topic, []).append(entry)
    return tuple(
        build(topic_cls, name=name, **{partitions: tuple(parts)}) for name, parts in grouped.items()
    )


def by_topic_in_steps(
    entries: Iterable[tuple[str, Any]], topic_cls: type, partitions: str = "partitions"
) -> Generator[None, None, tuple[Any, ...]]:
    """`by_topic`, one step per entry (handlers/slices.py)."""
    grouped: dict[str, list[Any]] = {}
    for topic, entry in entries:
        grouped.setdefault(topic, []).append(entry)
        yield
    return tuple(
        build(topic_cls, name=name, **{partitions: tuple(parts)}) for name, parts in grouped.items()
    )


def partition_errors(
    errors: dict[tuple[str, int], Any],
    topic_cls: type,
    part_cls: type,
    *,
    partitions: str = "partitions",
    error: str = "error_code",
) -> tuple[Any, ...]:
    """Each partition's error code, as topic entities holding their partitions' entries (the
    entries' fields named `partitions` and `error` where the API names them otherwise)."""
    return by_topic(
        (
            (topic, build(part_cls, partition_index=index, **{error: code}))
            for (topic, index), code in errors.items()
        ),
        topic_cls,
        partitions,
    )


def results_response(request: Request, result_entity: str, results: Iterable[Any]) -> Any:
    """A response that is its `results` and no throttle (CreateAcls, AlterUserScramCredentials):
    one `result_entity` per result object, from its attributes of the same names."""
    cls, result_cls = response_classes(request, result_entity)
    return build(
        cls, throttle_time=NO_THROTTLE, results=tuple(build_from(result_cls, r) for r in results)
    )
