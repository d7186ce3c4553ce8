"""Check every declared count and length of a request body against the bytes that follow it.

kio's native reader reserves room for an array from its declared count before it reads a single
element: a 40-byte request that announces 2**34 elements makes the allocator abort the whole
broker process, which no `except` can catch. So the body is first walked here, following the
same kio schema, and any count or length that runs past the end of the frame, or a null where
the schema has a non-nullable array (kio would hand the handler None), is a MalformedRequestError:
the connection is closed, as Kafka closes it on a request it cannot parse.

The same walk tells whether a body is small enough to decode on the event loop: with a budget
of elements, it stops at the first array that would exceed it (`ElementBudgetExceeded`).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from dataclasses import Field, fields, is_dataclass
from functools import cache
from types import NoneType, UnionType
from typing import Any, get_args, get_origin

from onceflow.protocol.errors import MalformedRequestError

# (buffer, position, end) -> position after the value
Step = Callable[[bytes, int, int], int]

_FIXED_SIZES = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "float64": 8,
    "datetime_i64": 8,
    "timedelta_i64": 8,
    "uuid": 16,
}
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_MAX_VARINT_BYTES = 5  # as kio and Kafka read an unsigned varint


class ElementBudgetExceeded(Exception):
    """The body declares more array elements than the walk was allowed to visit: not an error
    of the request, a sign it is too big to be handled in one turn of the event loop."""


# Elements the current walk may still visit, per thread (bodies are walked on the event loop
# and, when big, in a worker thread); None: no budget.
_budget = threading.local()


def read_uvarint(buf: bytes, pos: int, end: int | None = None) -> tuple[int, int]:
    """An unsigned varint of at most five bytes: (value, position after it)."""
    end = len(buf) if end is None else end
    result = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos >= end:
            raise MalformedRequestError("unsigned varint runs past the end of the request")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            return result, pos
    raise MalformedRequestError("unsigned varint longer than five bytes")


def skip_tagged_fields(buf: bytes, pos: int) -> int:
    """The position after the tagged fields at `pos` of a request or response header (none of
    which onceflow reads); MalformedRequestError when they run past the end of `buf`."""
    return _tagged_fields(buf, pos, len(buf), {})


def check_lengths(cls: type, buf: bytes, pos: int, max_elements: int | None = None) -> None:
    """Raise MalformedRequestError unless the body of kio type `cls` at `pos` fits in `buf`;
    ElementBudgetExceeded once its arrays declare more than `max_elements` elements in all
    (counted before they are walked, so a huge body costs no more than a small one)."""
    _budget.left = max_elements
    try:
        _entity(cls)(buf, pos, len(buf))
    finally:
        _budget.left = None


def _past_end(what: str) -> MalformedRequestError:
    return MalformedRequestError(f"{what} runs past the end of the request")


def _fixed(size: int) -> Step:
    def step(buf: bytes, pos: int, end: int) -> int:
        if pos + size > end:
            raise _past_end("a field")
        return pos + size

    return step


def _int(fmt: struct.Struct, buf: bytes, pos: int, end: int) -> tuple[int, int]:
    if pos + fmt.size > end:
        raise _past_end("a length")
    return fmt.unpack_from(buf, pos)[0], pos + fmt.size


def _length(flexible: bool, legacy: struct.Struct) -> Callable[[bytes, int, int], tuple[int, int]]:
    """Reads a length or count: compact (N + 1, 0 for null) or legacy (-1 for null); null is -1."""

    def compact(buf: bytes, pos: int, end: int) -> tuple[int, int]:
        n, pos = read_uvarint(buf, pos, end)
        return n - 1, pos

    def fixed(buf: bytes, pos: int, end: int) -> tuple[int, int]:
        n, pos = _int(legacy, buf, pos, end)
        if n < -1:
            raise MalformedRequestError(f"negative length {n}")
        return n, pos

    return compact if flexible else fixed


def _sized(flexible: bool, legacy: struct.Struct) -> Step:
    read = _length(flexible, legacy)

    def step(buf: bytes, pos: int, end: int) -> int:
        n, pos = read(buf, pos, end)
        if pos + max(n, 0) > end:
            raise _past_end(f"a string or bytes of {n}")
        return pos + max(n, 0)

    return step


def _primitive(kafka_type: str, flexible: bool) -> tuple[Step, int]:
    """The step for one value, and the fewest bytes it can take."""
    if kafka_type in _FIXED_SIZES:
        return _fixed(_FIXED_SIZES[kafka_type]), _FIXED_SIZES[kafka_type]
    if kafka_type == "string":
        return _sized(flexible, _INT16), 1
    if kafka_type in ("bytes", "records"):
        return _sized(flexible, _INT32), 1
    raise TypeError(f"no length rule for kafka type {kafka_type!r}")


def _array(element: Step, least: int, flexible: bool, nullable: bool) -> Step:
    read = _length(flexible, _INT32)

    def step(buf: bytes, pos: int, end: int) -> int:
        count, pos = read(buf, pos, end)
        if count < 0 and not nullable:
            # kio would hand handlers None where the schema promises a tuple; Kafka refuses it
            raise MalformedRequestError("a non-nullable array is null")
        # Checked before walking, so that an absurd count costs nothing.
        if count * least > end - pos:
            raise _past_end(f"an array of {count} elements")
        left = getattr(_budget, "left", None)
        if left is not None and count > 0:
            if count > left:
                raise ElementBudgetExceeded(count)
            _budget.left = left - count
        for _ in range(count):
            pos = element(buf, pos, end)
        return pos

    return step


def _nullable_entity(inner: Step) -> Step:
    def step(buf: bytes, pos: int, end: int) -> int:
        if pos >= end:
            raise _past_end("a struct")
        return pos + 1 if buf[pos] & 0x80 else inner(buf, pos + 1, end)  # a negative marker is null

    return step


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) is UnionType:
        args = [a for a in get_args(tp) if a is not NoneType]
        return args[0], len(args) < len(get_args(tp))
    return tp, False


def _field(f: Field[Any], flexible: bool) -> Step:
    tp, optional = _strip_optional(f.type)
    if get_origin(tp) is tuple:
        element_type, _ = _strip_optional(get_args(tp)[0])
        if is_dataclass(element_type):
            return _array(_entity(element_type), 1, flexible, optional)
        element, least = _primitive(f.metadata["kafka_type"], flexible)
        return _array(element, least, flexible, optional)
    if is_dataclass(tp):
        return _nullable_entity(_entity(tp)) if optional else _entity(tp)
    return _primitive(f.metadata["kafka_type"], flexible)[0]


@cache
def _entity(cls: type) -> Step:
    flexible = bool(cls.__flexible__)
    steps: list[Step] = []
    tagged: dict[int, Step] = {}
    for f in fields(cls):
        step = _field(f, flexible)
        if "tag" in f.metadata:
            tagged[f.metadata["tag"]] = step
        else:
            steps.append(step)

    def walk(buf: bytes, pos: int, end: int) -> int:
        for step in steps:
            pos = step(buf, pos, end)
        if flexible:
            pos = _tagged_fields(buf, pos, end, tagged)
        return pos

    return walk


def _tagged_fields(buf: bytes, pos: int, end: int, known: dict[int, Step]) -> int:
    count, pos = read_uvarint(buf, pos, end)
    if count > end - pos:
        raise _past_end(f"{count} tagged fields")
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos, end)
        size, pos = read_uvarint(buf, pos, end)
        if pos + size > end:
            raise _past_end(f"tagged field {tag}")
        if tag in known:
            known[tag](buf, pos, pos + size)  # kio parses known tags: they must fit their size
        pos += size
    return pos
