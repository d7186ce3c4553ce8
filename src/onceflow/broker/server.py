"""The broker: owns the topic registry, the coordinators and the listening socket."""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from functools import partial
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.broker.big_requests import BigRequests
from onceflow.broker.config import BrokerConfig
from onceflow.broker.connection import Connection
from onceflow.broker.connection_quotas import ConnectionQuotas
from onceflow.broker.data_dir import open_data_dir
from onceflow.broker.dispatch import HandlerResult, bind_handlers, supported_versions, with_metrics
from onceflow.broker.durability import (
    GroupCommitter,
    NotDurableError,
    PartitionsNotDurableError,
    until_durable,
)
from onceflow.broker.features import FinalizedFeatures, advertised_apis
from onceflow.broker.handlers.context import (
    AdminContext,
    DataContext,
    GroupCommit,
    GroupsContext,
    HandlerContexts,
    Node,
    SecurityContext,
    TxnContext,
)
from onceflow.broker.handlers.slices import Sliced, Work
from onceflow.broker.handlers.transactions import add_for_leader
from onceflow.broker.log_cleaner import LogCleaner
from onceflow.broker.malloc import HeapTrimmer
from onceflow.broker.memory_pool import MemoryPool
from onceflow.broker.partition import Partition
from onceflow.broker.security import BrokerSecurity
from onceflow.broker.storage_failure import halt_on_storage_error
from onceflow.broker.topics import TopicRegistry
from onceflow.clock import Clock, system_clock
from onceflow.coordinator.coordinators import Coordinators
from onceflow.coordinator.internal_log import (
    InternalLog,
    finish_legacy_rewrite,
    internal_log_configs,
)
from onceflow.coordinator.runtime import replay_offsets_batch
from onceflow.fault_points import raise_point
from onceflow.groups.config import GroupCoordinatorConfig
from onceflow.groups.coordinator import GroupCoordinator
from onceflow.halt import halt
from onceflow.log.errors import LogClosedError
from onceflow.log.file_handles import capacity_for_limit, raise_open_files_limit
from onceflow.log.file_handles import configure as configure_file_handles
from onceflow.metrics.counters import NO_COUNTERS, BrokerCounters
from onceflow.metrics.endpoint import MetricsEndpoint
from onceflow.metrics.snapshot import BrokerState, read_state
from onceflow.protocol.errors import ProtocolError
from onceflow.protocol.messages import Request
from onceflow.rate_limited_log import RateLimitedLog
from onceflow.records.record import DecodedBatch
from onceflow.security.listeners import Listener
from onceflow.txn.coordinator import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, TransactionCoordinator

log = logging.getLogger("onceflow.broker")
_loop_errors = RateLimitedLog(log)
_connection_log = RateLimitedLog(log)

# accept() failing for lack of descriptors or memory: the connection waits in the backlog while
# we back off, as asyncio's own accept loop does, instead of spinning on a readable listener.
_ACCEPT_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_RETRY_DELAY = 1.0
ACCEPT_BATCH = 256  # connections accepted per turn of the event loop, at most
# Replaying __consumer_offsets: this long before listening (a small log is loaded before the
# first client connects, as before), then slices this long between turns of the event loop.
OFFSETS_LOAD_BEFORE_LISTEN_S = 0.5
OFFSETS_LOAD_SLICE_S = 0.02


class HandlerCrashError(ProtocolError):
    """A handler raised unexpectedly: that connection is closed, the broker goes on."""


class Broker:
    def __init__(self, config: BrokerConfig, clock: Clock = system_clock) -> None:
        self.config = config
        self.clock = clock
        self.supported = supported_versions()
        # transaction.version finalized (features.py); the start time orders the epochs.
        self.features = FinalizedFeatures(config.transaction_version, int(time.time() * 1000))
        self.supported = advertised_apis(self.supported, self.features)
        self.cluster_id = open_data_dir(config.data_dir, config.node_id)
        # security hook: listeners, TLS, SASL and the SCRAM credentials (onceflow.security)
        self.security = BrokerSecurity.from_config(config)
        self.topics = TopicRegistry(config, clock)
        self.committer = GroupCommitter(enabled=config.fsync)
        self._internal_partitions: list[Partition] = []
        self.offsets_log = self.internal_log(OFFSETS_TOPIC, config.offsets_topic_segment_bytes)
        self.groups = GroupCoordinator(
            clock,
            GroupCoordinatorConfig.from_properties(
                {
                    k: v
                    for k, v in config.kafka_settings().items()
                    if k.startswith(("group.", "offsets."))
                }
            ),
            write_records=self.write_group_records,
        )
        # After the groups: the coordinators settle their transactional offsets.
        self.coordinators = Coordinators(
            TransactionCoordinator(
                clock, transaction_max_timeout_ms=config.transaction_max_timeout_ms
            ),
            self.groups,
            transaction_log=self.internal_log(
                TRANSACTION_STATE_TOPIC, config.transaction_state_log_segment_bytes
            ),
            offsets_log=self.offsets_log,
            partitions=self.topics,
            until_durable=partial(until_durable, self.committer),
            on_error=halt_on_storage_error,
            clock=clock,
            cleanup_interval_ms=config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
        )
        self.cleaner = LogCleaner(config, self.topics, self.internal_partitions, clock)
        self._listeners: list[socket.socket] = []
        self._acceptors: list[asyncio.Task[None]] = []
        self._handshakes: set[asyncio.Task[None]] = set()  # TLS connections being set up
        self.bound_ports: dict[str, int] = {}  # listener name -> bound port
        self._tasks: set[asyncio.Task[Any]] = set()
        self._connections: set[Connection] = set()
        self._stopping = False
        self._offsets_load: asyncio.Task[None] | None = None
        # Exceptions each background loop recovered from, by loop name (for tests and logs).
        self.background_errors: dict[str, int] = {}
        self.quotas = ConnectionQuotas(
            config.max_connections,
            config.max_connections_per_ip,
            config.max_connections_per_ip_overrides,
        )
        self.request_memory = MemoryPool(config.queued_max_request_bytes)
        self.heap = HeapTrimmer()
        self.node = Node(config.node_id, config.advertised, config.port, self.cluster_id)
        # Prometheus metrics (onceflow.metrics): counted only when metrics.listen is set.
        self.counters = BrokerCounters() if config.metrics_address() else NO_COUNTERS
        self.metrics_endpoint: MetricsEndpoint | None = None
        self._handlers = bind_handlers(self._handler_contexts())
        self._handlers = with_metrics(self._handlers, self.counters)
        if self.counters.enabled:
            self.counters.topic_by_id = self.topics.by_id
            self.committer.on_flush = self.counters.flushed
        self.big_requests = BigRequests()  # requests too big for one turn of the event loop

    @property
    def port(self) -> int:
        return self.node.port

    def _handler_contexts(self) -> HandlerContexts:
        """What each family of handlers is given (handlers/context.py), not the broker."""
        groups = GroupsContext(self.groups, self.topics, self.write_offsets_records)
        txn = TxnContext(self.coordinators.transaction_coordinator, self.coordinators, groups)
        # transaction.version 2: Produce v12 adds its partitions to the transaction.
        adder = partial(add_for_leader, txn) if self.features.transactions_v2 else None
        return HandlerContexts(
            supported=self.supported,
            admin=AdminContext(self.node, self.config, self.topics, self.advertised_endpoint),
            data=DataContext(
                self.config,
                self.topics,
                self.coordinators.transaction_coordinator,
                GroupCommit(self.make_durable, self.committer.wait_durable, self.not_durable_code),
                self.clock,
                metrics=self.counters,
                add_to_transaction=adder,
            ),
            groups=groups,
            txn=txn,
            security=SecurityContext(self.security),
        )

    def internal_log(self, topic: str, segment_bytes: int) -> InternalLog:
        """A coordinator's log, `compact` as Kafka creates its internal topics."""
        directory = self.config.data_dir / f"{topic}-0"
        finish_legacy_rewrite(directory)
        partition = Partition.open(
            topic,
            0,
            directory,
            self.topics.log_config(internal_log_configs(segment_bytes)),
            self.clock,
            self.config.producer_id_expiration_ms,
        )
        self._internal_partitions.append(partition)
        return InternalLog(partition, self.clock)

    def internal_partitions(self) -> list[Partition]:
        """The coordinators' logs, which the log cleaner compacts beside the topics'."""
        return list(self._internal_partitions)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen once the topics and the transaction log are loaded; `__consumer_offsets` may
        still be loading then (group requests answer COORDINATOR_LOAD_IN_PROGRESS meanwhile,
        as Kafka's): what needs the groups' state starts after it (_start_coordinators)."""
        self.topics.load()
        self.groups.begin_loading()
        batches = self._offsets_batches()
        loaded = _replay_for(batches, self.groups, OFFSETS_LOAD_BEFORE_LISTEN_S)
        transactions_loading = time.monotonic()
        self.coordinators.load()
        self.transactions_load_seconds = time.monotonic() - transactions_loading
        loop = asyncio.get_running_loop()
        for listener in self.security.listeners:
            sock = await _listen(
                listener.host, listener.port, self.config.socket_listen_backlog_size
            )
            self._listeners.append(sock)
            self.bound_ports[listener.name] = sock.getsockname()[1]
            self._acceptors.append(loop.create_task(self._accept(sock, listener)))
        self.node.port = self.bound_ports[self.security.listeners[0].name]
        await self._start_metrics()
        if loaded:
            self._start_coordinators()
        else:
            self._offsets_load = loop.create_task(self._load_offsets_later(batches))
            self._offsets_load.add_done_callback(self._offsets_load_ended)

    async def _start_metrics(self) -> None:
        """The scrape endpoint (metrics.listen), on this event loop (metrics/endpoint.py)."""
        address = self.config.metrics_address()
        if address is None:
            return
        state = BrokerState(
            topics=self.topics,
            partition=self.topics.partition,
            transactions=self.coordinators.transaction_coordinator,
            groups=self.groups,
            cleaner=self.cleaner,
            quotas=self.quotas,
            committer=self.committer,
            transactions_load_seconds=self.transactions_load_seconds,
        )
        read = partial(read_state, self.counters, state)
        self.metrics_endpoint = MetricsEndpoint(read, *address)
        await self.metrics_endpoint.start()

    def _start_coordinators(self) -> None:
        """With the offsets loaded: the group requests, the timers and the background tasks
        that read or write the groups' state, and the in-doubt transactions' markers (which
        may settle offsets)."""
        self.groups.complete_loading()
        self._spawn(
            "retention",
            self._every("retention", self._retention_delay, self._retention_tick),
        )
        self._spawn(
            "log-cleaner",
            self._every("log-cleaner", self.cleaner.delay, self.cleaner.tick),
        )
        self._spawn(
            "group-timer",
            self._every("group-timer", self._group_timer_delay, self._group_timer_tick),
        )
        self._spawn(
            "consumer-group-timer",
            self._every(
                "consumer-group-timer",
                self._consumer_group_timer_delay,
                self._consumer_group_timer_tick,
            ),
        )
        self._spawn(
            "transaction-timeout",
            self._every(
                "transaction-timeout",
                self.coordinators.timeout_delay,
                self.coordinators.timeout_tick,
            ),
        )
        self.coordinators.complete_in_doubt()

    async def _load_offsets_later(self, batches: Iterator[DecodedBatch]) -> None:
        started = time.monotonic()
        while not _replay_for(batches, self.groups, OFFSETS_LOAD_SLICE_S):
            await asyncio.sleep(0)  # other clients are served between slices
        log.info("loaded %s in %.1fs after listening", OFFSETS_TOPIC, time.monotonic() - started)
        self._start_coordinators()

    def _offsets_load_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._stopping:
            return
        error = task.exception()
        if error is not None:
            log.critical("loading %s failed: %r", OFFSETS_TOPIC, error, exc_info=error)
            halt(error)

    async def stop(self) -> None:
        self._stopping = True
        if self._offsets_load is not None:
            self._offsets_load.cancel()
            await asyncio.gather(self._offsets_load, return_exceptions=True)
        for acceptor in [*self._acceptors, *self._handshakes]:
            acceptor.cancel()
        await asyncio.gather(*self._acceptors, *self._handshakes, return_exceptions=True)
        for sock in self._listeners:
            sock.close()
        if self.metrics_endpoint is not None:
            await self.metrics_endpoint.stop()
        # Clients are dropped before the logs close, so that no request runs against them.
        connections = list(self._connections)
        for connection in connections:
            connection.abort()
        await asyncio.gather(*(c.closed() for c in connections))
        self.heap.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.coordinators.stop()
        self.topics.close()
        self.offsets_log.close()
        self.committer.close()
        self.big_requests.close()

    async def _accept(self, sock: socket.socket, listener: Listener) -> None:
        """The acceptor: waits for a slot under max.connections (KIP-402), closes at once a
        connection over max.connections.per.ip, backs off when out of descriptors."""
        loop = asyncio.get_running_loop()
        while True:
            await self.quotas.wait_for_slot()
            try:
                accepted = [await loop.sock_accept(sock)]
                # Drain the backlog in one turn of the loop, not one turn per connection: a
                # burst must not overflow the backlog while requests are being served.
                while len(accepted) < ACCEPT_BATCH and self.quotas.slot_available(len(accepted)):
                    try:
                        client, address = sock.accept()
                    except BlockingIOError:
                        break
                    client.setblocking(False)
                    accepted.append((client, address))
            except OSError as e:
                if e.errno in _ACCEPT_RESOURCE_ERRNOS:
                    _connection_log.warning(
                        "accept",
                        "cannot accept connections: %s; retrying every %.0fs",
                        e,
                        ACCEPT_RETRY_DELAY,
                    )
                    await asyncio.sleep(ACCEPT_RETRY_DELAY)
                    continue
                if e.errno == errno.ECONNABORTED:
                    continue  # the client gave up before we accepted
                raise
            if listener.protocol.uses_tls:
                # A TLS handshake takes round trips (or a client that never finishes one): it
                # must not hold up the acceptor, so each runs on its own.
                for client, addr in accepted:
                    task = loop.create_task(self._attach(loop, client, addr, listener))
                    self._handshakes.add(task)
                    task.add_done_callback(self._handshakes.discard)
            else:
                await asyncio.gather(
                    *(self._attach(loop, client, addr, listener) for client, addr in accepted)
                )

    async def _attach(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        address: Any,
        listener: Listener,
    ) -> None:
        host = address[0] if isinstance(address, tuple) else str(address)
        if not self.quotas.admit(host):
            sock.close()
            _connection_log.info(
                f"per-ip:{host}",
                "rejected connection from %s: it has the maximum of %d connections "
                "(max.connections.per.ip)",
                host,
                self.quotas.limit_for(host),
            )
            return
        connection = Connection(self, host, listener)
        self._connections.add(connection)
        tls = self.security.tls if listener.protocol.uses_tls else None
        try:
            await loop.connect_accepted_socket(
                lambda: connection,
                sock,
                ssl=tls,
                ssl_handshake_timeout=_handshake_timeout(self.config) if tls else None,
            )
        except OSError as e:
            sock.close()
            self.connection_closed(connection)
            if tls is None:
                _connection_log.warning("accept-setup", "cannot set up a connection: %s", e)
            else:
                # Kafka logs this as a failed authentication (an untrusted or expired
                # certificate, a client that does not speak TLS, a handshake timed out).
                _connection_log.info(
                    f"tls:{host}",
                    "failed authentication with %s on listener %s (SSL handshake failed): %s",
                    host,
                    listener.name,
                    getattr(e, "reason", None) or e,
                )
        except asyncio.CancelledError:
            if connection.transport is None:  # stopped before the connection was set up
                sock.close()
                self.connection_closed(connection)
            raise

    def connection_closed(self, connection: Connection) -> None:
        if connection in self._connections:
            self._connections.discard(connection)
            self.quotas.release(connection.host)
            self.heap.request()  # what its buffers held goes back to the OS (malloc.py)

    # -- supervised background tasks ---------------------------------------------------------

    def _spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        """Run a background task that must live as long as the broker: if it ever ends other
        than by stop(), the broker halts (a loop that stopped would silently stop session
        expiry or transaction timeouts), as on a storage failure."""
        task = asyncio.get_running_loop().create_task(coro, name=f"onceflow-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda done: self._task_ended(name, done))

    def _task_ended(self, name: str, task: asyncio.Task[None]) -> None:
        if self._stopping or task.cancelled():
            return
        error = task.exception()
        log.critical("background task %s stopped: %r", name, error, exc_info=error)
        halt(error or RuntimeError(f"background task {name} returned"))

    async def _every(
        self,
        name: str,
        delay: Callable[[], float],
        tick: Callable[[], Awaitable[None]],
    ) -> None:
        """Run `tick` after each `delay()` seconds, forever. An exception in one tick is logged
        (rate-limited) and the loop goes on at its next tick; a storage failure halts."""
        while True:
            await asyncio.sleep(delay())
            try:
                raise_point(f"loop.{name}")
                await tick()
            except Exception as e:
                halt_on_storage_error(e)
                self.background_errors[name] = self.background_errors.get(name, 0) + 1
                _loop_errors.error(
                    name,
                    f"background task {name} failed (it goes on at its next tick): %r",
                    e,
                    exc_info=True,
                )

    def _retention_delay(self) -> float:
        return self.config.log_retention_check_interval_ms / 1000

    async def _retention_tick(self) -> None:
        """log.retention.check.interval.ms: delete expired segments, forget idle producers
        (producer.id.expiration.ms) and expired group offsets (offsets.retention.minutes)."""
        for topic in list(self.topics):
            for partition in topic.partitions:
                try:
                    deleted = partition.apply_retention()
                except LogClosedError:
                    continue  # deleted by DeleteTopics meanwhile
                if deleted:
                    log.info(
                        "retention deleted %d segment(s) of %s-%d",
                        deleted,
                        topic.name,
                        partition.index,
                    )
        for partition in self.internal_partitions():
            partition.apply_retention()  # compact: only producer.id.expiration.ms applies
        expired = self.groups.cleanup_expired_offsets()
        if expired.records:
            await self.write_offsets_records(expired.records, None)

    def _group_timer_delay(self) -> float:
        deadline = self.groups.next_deadline()
        delay = 0.1 if deadline is None else (deadline - self.clock()) / 1000
        return min(max(delay, 0.005), 0.1)

    async def _group_timer_tick(self) -> None:
        self.groups.tick()

    def _consumer_group_timer_delay(self) -> float:
        deadline = self.groups.consumer_group_next_deadline()
        delay = 0.1 if deadline is None else (deadline - self.clock()) / 1000
        return min(max(delay, 0.005), 0.1)

    async def _consumer_group_timer_tick(self) -> None:
        """KIP-848 members whose session or revocation timed out are fenced (records)."""
        fenced = self.groups.consumer_group_tick(self.topics)
        if fenced.records:
            await self.write_offsets_records(fenced.records, None)

    # -- group offsets ----------------------------------------------------------------------

    def _offsets_batches(self) -> Iterator[DecodedBatch]:
        """The offsets log (compacted by the log cleaner while the broker runs) up to its end
        now: nothing is appended to it until the load is over (group requests are refused)."""
        end = self.offsets_log.log.log_end_offset
        return itertools.takewhile(
            lambda batch: batch.header.base_offset < end, self.offsets_log.batches()
        )

    def write_offsets_records(
        self,
        records: list[tuple[bytes, bytes | None]],
        response: Any,
        *,
        producer_id: int = -1,
        producer_epoch: int = -1,
    ) -> Any:
        """Append a group coordinator's records, then (once durable) replay them and answer
        (the coordinator runtime's write_offsets): `response`, or an awaitable of it.

        With a producer id (TxnOffsetCommit) they are a transactional batch of that producer,
        pending until its transaction's marker, as `_load_offsets` replays them after a restart.
        """
        if not records:
            return response
        return self.coordinators.write_offsets(
            records, response, producer_id=producer_id, producer_epoch=producer_epoch
        )

    def write_group_records(
        self, records: list[tuple[bytes, bytes | None]], done: Callable[[ErrorCode], None]
    ) -> None:
        """The classic groups' records (groups/membership.py says when): appended now, `done`
        with the append's error once durable or failed. They are replayed as every offsets
        record is, which changes nothing live (the group changed before they were written)."""
        try:
            written = self.write_offsets_records(records, None)
        except Exception as e:
            halt_on_storage_error(e)
            log.warning("writing group metadata failed: %r", e)
            done(_group_append_error(e))
            return

        def durable(future: asyncio.Future[Any]) -> None:
            error = None if future.cancelled() else future.exception()
            if future.cancelled() or error is not None:
                log.warning("group metadata not durable: %r", error)
                done(_group_append_error(error))
            else:
                done(ErrorCode.none)

        asyncio.ensure_future(written).add_done_callback(durable)

    # -- durability -------------------------------------------------------------------------

    def make_durable(self, partitions: list[Partition]) -> asyncio.Future[None]:
        """Start (or join) the group-commit flush of each partition's log; each wakes its readers
        itself when its high watermark moves (Partition._high_watermark_moved). A failed fsync
        halts the broker (durability.py); partitions that could not be made durable raise
        PartitionsNotDurableError with their error codes (the others are durable)."""
        future = asyncio.ensure_future(self._durable(partitions))
        future.add_done_callback(_retrieve)
        return future

    async def _durable(self, partitions: list[Partition]) -> None:
        if not partitions:
            return
        errors: dict[tuple[str, int], ErrorCode] = {}
        try:
            await self.committer.wait_durable({p.log for p in partitions})
        except NotDurableError as e:
            for p in partitions:
                if p.log in e.failures:
                    errors[(p.topic, p.index)] = self.not_durable_code(p, e.failures[p.log])
        for p in partitions:
            if (p.topic, p.index) in errors:
                continue
            if self.topics.partition(p.topic, p.index) is not p:
                # Deleted while the round ran: Kafka answers a produce waiting on a deleted
                # partition so (DelayedProduce, getPartitionOrError).
                errors[(p.topic, p.index)] = ErrorCode.unknown_topic_or_partition
        if errors:
            raise PartitionsNotDurableError(errors)

    def not_durable_code(self, partition: Partition, error: BaseException) -> ErrorCode:
        """The error a write to `partition` answers when its round could not make it durable
        (NotDurableError.failures)."""
        if isinstance(error, LogClosedError):
            if self.topics.partition(partition.topic, partition.index) is not partition:
                return ErrorCode.unknown_topic_or_partition  # deleted
            return ErrorCode.not_leader_or_follower  # closed (shutting down)
        # Appended but not yet synced (EMFILE while preparing the flush): retriable, and the
        # client treats the write as possibly persisted, which it is (a retry of an idempotent
        # producer is deduplicated).
        return ErrorCode.not_enough_replicas_after_append

    # -- requests ---------------------------------------------------------------------------

    def advertised_endpoint(self, request: Request) -> tuple[str, int]:
        """(host, port) of the listener `request` came in on, as Metadata and FindCoordinator
        give it (advertised.listeners)."""
        session = request.session
        name = session.listener.name if session is not None else self.security.listeners[0].name
        return self.security.advertised_endpoint(name, self.bound_ports.get(name, self.port))

    def dispatch(self, connection: Connection, request: Request) -> HandlerResult:
        return self.big_requests.dispatch(connection, request, self._handle)

    def _handle(self, request: Request) -> HandlerResult:
        handle = self._handlers[request.api_key]
        try:
            result = handle(request)
        except ProtocolError:
            raise
        except Exception as e:
            raise self._crashed(request, e) from e
        if isinstance(result, Sliced):
            # Its steps run later, in the dispatch's task: their failures are the handler's.
            return Sliced(self._guarded(request, result.work))
        return result

    def _guarded(self, request: Request, work: Work) -> Work:
        try:
            return (yield from work)
        except ProtocolError:
            raise
        except Exception as e:
            raise self._crashed(request, e) from e

    def _crashed(self, request: Request, e: Exception) -> HandlerCrashError:
        """A handler's failure: a storage failure halts the broker; any other is logged."""
        halt_on_storage_error(e)
        log.exception("API %d v%d handler failed", request.api_key, request.api_version)
        return HandlerCrashError(f"handler failed: {e!r}")


def _replay_for(batches: Iterator[DecodedBatch], groups: GroupCoordinator, seconds: float) -> bool:
    """Replay offsets batches for about `seconds`; True once there are none left."""
    deadline = time.monotonic() + seconds
    for batch in batches:
        replay_offsets_batch(groups, batch)
        if time.monotonic() >= deadline:
            return False
    return True


def _group_append_error(error: BaseException | None) -> ErrorCode:
    """The Kafka error of a failed append to the offsets log, as the group coordinator sees it."""
    if isinstance(error, LogClosedError):
        return ErrorCode.not_leader_or_follower  # closed: the broker is stopping
    code = getattr(error, "error_code", None)
    return code if isinstance(code, ErrorCode) else ErrorCode.unknown_server_error


def _handshake_timeout(config: BrokerConfig) -> float:
    # Kafka bounds a connection that never completes its handshake by connections.max.idle.ms.
    idle = config.connections_max_idle_ms
    return idle / 1000 if idle > 0 else 60.0


async def _listen(host: str, port: int, backlog: int) -> socket.socket:
    """The listening socket, with socket.listen.backlog.size: asyncio's default of 100 drops
    the SYNs of a burst beyond it (clients retry after 1 s, 3 s...)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _retrieve(future: asyncio.Future[None]) -> None:
    # acks=0/1 writers do not await durability: an error is logged here, not lost.
    if future.cancelled():
        return
    error = future.exception()
    if isinstance(error, PartitionsNotDurableError):
        log.warning("%s", error)  # the next round covers what is left dirty
    elif error is not None:
        log.error("fsync failed: %s", error)


async def serve_forever(config: BrokerConfig) -> None:
    """Run until SIGTERM/SIGINT; log one line when ready."""
    # As the JVM does for Kafka: soft RLIMIT_NOFILE up to the hard limit, then the log
    # layer's share of it (file_handles.py); connections and the rest get the remainder.
    configure_file_handles(capacity_for_limit(raise_open_files_limit()))
    broker = Broker(config)
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_rate_limited_exception_handler)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if broker.metrics_endpoint is not None:
        print(f"onceflow metrics on {broker.metrics_endpoint.url}", flush=True)
    fsync = "on" if config.fsync else "OFF (acknowledged writes can be lost on power failure)"
    # The first listener first (what EmbeddedBroker and scripts read), then every listener.
    first = broker.security.listeners[0]
    bound = ",".join(
        listener.url(broker.bound_ports[listener.name]) for listener in broker.security.listeners
    )
    print(
        f"onceflow broker ready on {first.host or '0.0.0.0'}:{broker.port} "
        f"(listeners: {bound}; data: {config.data_dir}, fsync: {fsync})",
        flush=True,
    )
    await stop.wait()
    log.info("shutting down")
    await broker.stop()


_asyncio_errors = RateLimitedLog(logging.getLogger("asyncio"))


def _rate_limited_exception_handler(
    loop: asyncio.AbstractEventLoop, context: dict[str, Any]
) -> None:
    """asyncio's handler, once per interval per message: a storm of one failure (a socket
    error on every connection) must not fill the disk."""
    suppressed = _asyncio_errors.admit(str(context.get("message", "")))
    if suppressed is not None:
        if suppressed:
            context = {**context, "suppressed": suppressed}
        loop.default_exception_handler(context)
