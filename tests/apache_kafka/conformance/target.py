"""The conformance suite's wire client: one broker (onceflow or Apache Kafka) spoken to with
kio entities at versions the suite fixes, so both brokers see byte-for-byte the same requests.

Requests are written as plain dicts (nested entities as dicts, durations in milliseconds) and
built into the kio classes of the version asked for."""

from __future__ import annotations

import dataclasses
import datetime
import time
import typing
from functools import cache
from typing import Any

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from onceflow.protocol.client import BrokerConnection, KafkaClientError, parse_address

UNSUPPORTED = "UNSUPPORTED_API"  # the broker does not advertise the API version the step sends
# Answers a client retries on the coordinator paths (Kafka's RetriableException codes): a step
# records the answer once they stop, as a client would see it through its retries. (Partition
# errors are not retried: a scenario waits for its topics before it starts.)
RETRIABLE = frozenset(
    {
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.coordinator_not_available,
        ErrorCode.not_coordinator,
        ErrorCode.concurrent_transactions,
    }
)
RETRY_DEADLINE_S = 60.0


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, __import__("types").UnionType):
        if value is None:
            return None
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
        origin = typing.get_origin(tp)
    if origin is tuple:
        inner = typing.get_args(tp)[0]
        return tuple(_convert(inner, v) for v in value)
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):
        return make(tp, **value)
    if isinstance(tp, type) and issubclass(tp, datetime.timedelta) and isinstance(value, int):
        return (
            tp(milliseconds=value)
            if tp is datetime.timedelta
            else tp.parse(datetime.timedelta(milliseconds=value))
        )
    if isinstance(tp, type) and tp not in (bool, str, bytes) and isinstance(value, int):
        try:
            return tp(value)
        except TypeError:
            return value
    return value


def make(cls: type, **fields: Any) -> Any:
    """The kio entity `cls` from `fields` (nested entities as dicts); fields the class lacks are
    an error (a scenario asking for a field its version does not have is a scenario bug)."""
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(fields) - names
    if unknown:
        raise TypeError(f"{cls.__module__}.{cls.__name__} has no fields {sorted(unknown)}")
    return cls(**{k: _convert(hints[k], v) for k, v in fields.items()})


class Target:
    """One broker under test: `name` is "onceflow" or "kafka"."""

    def __init__(self, name: str, bootstrap: str) -> None:
        self.name = name
        self.bootstrap = bootstrap
        self._connection: BrokerConnection | None = None

    def connection(self) -> BrokerConnection:
        if self._connection is None or not self._connection.is_open:
            host, port = parse_address(self.bootstrap)
            self._connection = BrokerConnection.connect(
                host, port, client_id="conformance", request_timeout_s=30
            )
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def supports(self, api_key: int, version: int) -> bool:
        low, high = self.connection().api_versions.get(api_key, (0, -1))
        return low <= version <= high

    def call(self, api_key: int, version: int, **fields: Any) -> Any:
        """One request at exactly `version`; UNSUPPORTED when the broker does not offer it."""
        if not self.supports(api_key, version):
            return UNSUPPORTED
        request = make(load_request_schema(api_key, version), **fields)
        try:
            return self.connection().send(request)
        except KafkaClientError:
            self.close()
            raise

    def call_retrying(
        self, api_key: int, version: int, error_of: typing.Callable[[Any], int], **fields: Any
    ) -> Any:
        """`call`, again while the answer's error (`error_of`) is retriable, as clients do."""
        deadline = time.monotonic() + RETRY_DEADLINE_S
        while True:
            response = self.call(api_key, version, **fields)
            if response == UNSUPPORTED or error_of(response) not in RETRIABLE:
                return response
            if time.monotonic() >= deadline:
                return response
            time.sleep(0.05)
