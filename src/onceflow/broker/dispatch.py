"""The table of implemented APIs: key, version range, handler, and the context it is given.

A handler runs synchronously in arrival order (so state changes happen in the order requests
arrived on a connection) and returns the response, an awaitable of it (fsync, long poll,
rebalance), or None when no response is due (Produce with acks=0).

The table is written out here, one row per API; adding an API is adding a row.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

from onceflow.broker.handlers import (
    acls,
    alter_configs,
    api_versions,
    client_quotas,
    configs,
    consumer_groups,
    coordinator_lookup,
    delete_records,
    fetch,
    groups,
    list_offsets,
    metadata,
    offsets,
    produce,
    sasl,
    topics_admin,
    transactions,
    txn_markers,
)
from onceflow.broker.handlers import scram_credentials as scram
from onceflow.broker.handlers.context import (
    HandlerContexts,
)
from onceflow.broker.handlers.slices import Sliced, Work
from onceflow.metrics.counters import BrokerCounters, kafka_request_name
from onceflow.metrics.histogram import Histogram
from onceflow.protocol.api_key import ApiKey
from onceflow.protocol.messages import Request
from onceflow.rate_limited_log import RateLimitedLog

_metrics_errors = RateLimitedLog(logging.getLogger(__name__))

HandlerResult = Any | Awaitable[Any] | None
BoundHandler = Callable[[Request], HandlerResult]
C = TypeVar("C")


@dataclass(frozen=True)
class ApiHandler(Generic[C]):
    """One implemented API. Versions below `parsed_from` are advertised (as Kafka does for
    Produce v0, see KAFKA-18659) but their requests are refused by closing the connection."""

    api_key: ApiKey
    min_version: int
    max_version: int
    handle: Callable[[C, Request], HandlerResult]
    context: str  # the family's context: the name of a field of HandlerContexts
    parsed_from: int | None = None


API_HANDLERS: tuple[ApiHandler[Any], ...] = (
    ApiHandler(ApiKey.PRODUCE, 0, 12, produce.handle_produce, "data", parsed_from=3),
    ApiHandler(ApiKey.FETCH, 4, 17, fetch.handle_fetch, "data"),
    ApiHandler(ApiKey.LIST_OFFSETS, 1, 9, list_offsets.handle_list_offsets, "data"),
    ApiHandler(ApiKey.METADATA, 0, 12, metadata.handle_metadata, "admin"),
    ApiHandler(ApiKey.OFFSET_COMMIT, 2, 9, offsets.handle_offset_commit, "groups"),
    ApiHandler(ApiKey.OFFSET_FETCH, 1, 9, offsets.handle_offset_fetch, "groups"),
    ApiHandler(ApiKey.FIND_COORDINATOR, 0, 6, coordinator_lookup.handle_find_coordinator, "admin"),
    ApiHandler(ApiKey.JOIN_GROUP, 0, 9, groups.handle_join_group, "groups"),
    ApiHandler(ApiKey.HEARTBEAT, 0, 4, groups.handle_heartbeat, "groups"),
    ApiHandler(ApiKey.LEAVE_GROUP, 0, 5, groups.handle_leave_group, "groups"),
    ApiHandler(ApiKey.SYNC_GROUP, 0, 5, groups.handle_sync_group, "groups"),
    ApiHandler(ApiKey.DESCRIBE_GROUPS, 0, 5, groups.handle_describe_groups, "groups"),
    ApiHandler(ApiKey.LIST_GROUPS, 0, 5, groups.handle_list_groups, "groups"),
    ApiHandler(ApiKey.API_VERSIONS, 0, 4, api_versions.handle_api_versions, "supported"),
    ApiHandler(ApiKey.CREATE_TOPICS, 2, 7, topics_admin.handle_create_topics, "admin"),
    ApiHandler(ApiKey.DELETE_TOPICS, 1, 6, topics_admin.handle_delete_topics, "admin"),
    ApiHandler(ApiKey.INIT_PRODUCER_ID, 0, 5, transactions.handle_init_producer_id, "txn"),
    ApiHandler(
        ApiKey.ADD_PARTITIONS_TO_TXN, 0, 3, transactions.handle_add_partitions_to_txn, "txn"
    ),
    ApiHandler(ApiKey.ADD_OFFSETS_TO_TXN, 0, 4, transactions.handle_add_offsets_to_txn, "txn"),
    ApiHandler(ApiKey.END_TXN, 0, 5, transactions.handle_end_txn, "txn"),
    ApiHandler(ApiKey.DELETE_RECORDS, 0, 2, delete_records.handle_delete_records, "data"),
    ApiHandler(ApiKey.WRITE_TXN_MARKERS, 1, 2, txn_markers.handle_write_txn_markers, "data"),
    ApiHandler(ApiKey.TXN_OFFSET_COMMIT, 0, 5, transactions.handle_txn_offset_commit, "txn"),
    ApiHandler(ApiKey.DESCRIBE_CONFIGS, 1, 4, configs.handle_describe_configs, "admin"),
    ApiHandler(ApiKey.ALTER_CONFIGS, 0, 2, alter_configs.handle_alter_configs, "admin"),
    ApiHandler(ApiKey.CREATE_PARTITIONS, 0, 3, topics_admin.handle_create_partitions, "admin"),
    ApiHandler(ApiKey.DELETE_GROUPS, 0, 2, groups.handle_delete_groups, "groups"),
    ApiHandler(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, 1, alter_configs.handle_incremental, "admin"),
    ApiHandler(ApiKey.DESCRIBE_PRODUCERS, 0, 0, transactions.handle_describe_producers, "data"),
    ApiHandler(
        ApiKey.DESCRIBE_TRANSACTIONS, 0, 0, transactions.handle_describe_transactions, "txn"
    ),
    ApiHandler(ApiKey.LIST_TRANSACTIONS, 0, 1, transactions.handle_list_transactions, "txn"),
    ApiHandler(ApiKey.SASL_HANDSHAKE, 0, 1, sasl.handle_sasl_handshake, "security"),
    ApiHandler(ApiKey.SASL_AUTHENTICATE, 0, 2, sasl.handle_sasl_authenticate, "security"),
    ApiHandler(
        ApiKey.DESCRIBE_CLIENT_QUOTAS, 0, 1, client_quotas.handle_describe_client_quotas, "admin"
    ),
    ApiHandler(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, 0, scram.handle_describe, "security"),
    ApiHandler(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, 0, scram.handle_alter, "security"),
    ApiHandler(ApiKey.DESCRIBE_ACLS, 1, 3, acls.handle_describe_acls, "security"),
    ApiHandler(ApiKey.CREATE_ACLS, 1, 3, acls.handle_create_acls, "security"),
    ApiHandler(ApiKey.DELETE_ACLS, 1, 3, acls.handle_delete_acls, "security"),
    ApiHandler(
        ApiKey.CONSUMER_GROUP_HEARTBEAT,
        0,
        1,
        consumer_groups.handle_consumer_group_heartbeat,
        "groups",
    ),
    ApiHandler(
        ApiKey.CONSUMER_GROUP_DESCRIBE,
        0,
        1,
        consumer_groups.handle_consumer_group_describe,
        "groups",
    ),
)


def parsed_versions() -> list[tuple[int, int]]:
    """(key, version) of every request the broker parses. kio loads a version's schema on the
    first request of it (not all 188 at start-up: that was half of a broker's start);
    tests/broker/test_dispatch.py checks that kio can read each of them."""
    return [
        (h.api_key, version)
        for h in API_HANDLERS
        for version in range(h.parsed_from or h.min_version, h.max_version + 1)
    ]


def supported_versions() -> dict[int, tuple[int, int]]:
    """The versions of each implemented API, by key: what ApiVersions advertises."""
    return {h.api_key: (h.min_version, h.max_version) for h in API_HANDLERS}


def bind_handlers(contexts: HandlerContexts) -> dict[int, BoundHandler]:
    """Every handler given its family's context: what the broker dispatches a request to."""
    return {h.api_key: partial(h.handle, getattr(contexts, h.context)) for h in API_HANDLERS}


def with_metrics(
    handlers: dict[int, BoundHandler], counters: BrokerCounters
) -> dict[int, BoundHandler]:
    """Each handler counted (kafka.network RequestMetrics: requests per API and version, total
    time per API) when the metrics endpoint is on; the handlers themselves otherwise."""
    if not counters.enabled:
        return handlers
    return {key: _timed(key, handle, counters) for key, handle in handlers.items()}


def _timed(api_key: int, handle: BoundHandler, counters: BrokerCounters) -> BoundHandler:
    name = kafka_request_name(api_key)
    timer = counters.request_timer(api_key)
    by_version = counters.requests_by_version(name)
    answered = counters.fetch_answered if api_key == ApiKey.FETCH else None
    clock = time.perf_counter

    def timed(request: Request) -> HandlerResult:
        # Written out (no calls but the clock's): about 1 us a request with the observation.
        started = clock()
        version = request.api_version
        by_version[version] = by_version.get(version, 0) + 1
        result = handle(request)
        if isinstance(result, Sliced) or hasattr(result, "__await__"):
            return _observe(result, started, timer, answered)
        timer.observe((clock() - started) * 1000)
        if answered is not None and result is not None:
            _count(answered, result)
        return result

    return timed


def _observe(
    result: HandlerResult,
    started: float,
    timer: Histogram,
    answered: Callable[[Any], None] | None,
) -> HandlerResult:
    """Time from dispatch until the response is ready (Kafka's TotalTimeMs also holds the
    queues and the write to the socket, which here are the connection's)."""
    if isinstance(result, Sliced):
        return Sliced(_observed_work(result.work, started, timer, answered))
    if hasattr(result, "__await__"):
        future = asyncio.ensure_future(result)
        future.add_done_callback(lambda done: _resolved(done, started, timer, answered))
        return future
    timer.observe((time.perf_counter() - started) * 1000)
    if answered is not None and result is not None:
        _count(answered, result)
    return result


def _observed_work(
    work: Work, started: float, timer: Histogram, answered: Callable[[Any], None] | None
) -> Work:
    result = yield from work
    return _observe(result, started, timer, answered)


def _resolved(
    future: asyncio.Future[Any],
    started: float,
    timer: Histogram,
    answered: Callable[[Any], None] | None,
) -> None:
    timer.observe((time.perf_counter() - started) * 1000)
    if answered is not None and not future.cancelled() and future.exception() is None:
        _count(answered, future.result())


def _count(answered: Callable[[Any], None], response: Any) -> None:
    """Counting a response must never cost the client its answer: a failure is logged."""
    try:
        answered(response)
    except Exception:
        _metrics_errors.error("count", "counting a response failed", exc_info=True)
