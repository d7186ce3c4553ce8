"""The `onceflow` tools' Kafka clients: confluent-kafka configured the same way for every tool
(the bootstrap address, the --command-config settings, librdkafka's errors collected so a
failure is one line), and an admin session that has checked a broker answers. Every tool
talks to the broker through them, so the same commands work against onceflow's broker and
against any Kafka cluster."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ClusterMetadata

from onceflow.client_properties import load_client_properties
from onceflow.kafka_errors import kafka_error_code
from onceflow.librdkafka_log import QUIET
from onceflow.tools.errors import (
    BrokerUnreachableError,
    CliError,
    TopicNotFoundError,
    UsageError,
    kafka_error_text,
)

# Short on purpose: a tool pointed at the wrong address should say so in seconds.
CONNECT_TIMEOUT_S = 5.0


REQUEST_TIMEOUT_S = 15.0

INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


@dataclass(frozen=True)
class Cluster:
    """Where a tool connects and how: the bootstrap address (None when not given: the tools
    that also work on a stopped broker's files take DEFAULT_BOOTSTRAP then) and the client
    settings of --command-config FILE (librdkafka's names). The CLI builds one per invocation
    and hands it to the tool functions, so no setting outlives the command."""

    bootstrap: str | None = None
    settings: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_options(cls, bootstrap: str | None, command_config: Path | None) -> Cluster:
        """From `--bootstrap-server` and `--command-config FILE`; raises
        ClientPropertiesError for an unusable file."""
        settings = {} if command_config is None else load_client_properties(command_config)
        return cls(bootstrap, settings)

    @property
    def address(self) -> str:
        return DEFAULT_BOOTSTRAP if self.bootstrap is None else self.bootstrap


T = TypeVar("T")


def parse_host_port(value: str) -> tuple[str, int]:
    """`HOST:PORT` (or `[v6addr]:PORT`) to its parts; UsageError when malformed."""
    host, sep, port_text = value.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"Invalid address '{value}': expected HOST:PORT.")
    return host.strip("[]"), int(port_text)


def parse_bootstrap(value: str) -> str:
    """Validate a comma-separated `HOST:PORT` list and return it normalised."""
    parts = [part.strip() for part in value.split(",") if part.strip()]
    if not parts:
        raise UsageError("--bootstrap-server is empty: expected HOST:PORT.")
    for part in parts:
        parse_host_port(part)
    return ",".join(parts)


@dataclass
class ClientErrors:
    """Collects librdkafka's error callbacks, so a failure can be explained in one line."""

    all_brokers_down: bool = False
    fatal: KafkaError | None = None
    last: KafkaError | None = None

    def __call__(self, error: KafkaError) -> None:
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self.all_brokers_down = True
        else:
            self.last = error
        if error.fatal():
            self.fatal = error

    def cause(self) -> str:
        """The most telling error seen, without librdkafka's `host:port/bootstrap: ` prefix."""
        if self.last is None:
            return "no answer"
        text = self.last.str()
        _, sep, rest = text.partition("/bootstrap: ")
        text = rest if sep else text
        return text.split(" (after ")[0]

    def raise_if_fatal(self) -> None:
        if self.fatal is not None:
            raise CliError(f"Fatal client error: {kafka_error_text(self.fatal)}")


def client_config(
    cluster: Cluster, errors: ClientErrors, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Base confluent-kafka configuration shared by every tool: the cluster's address and
    settings, then `overrides`."""
    config: dict[str, Any] = {
        "bootstrap.servers": cluster.address,
        "client.id": "onceflow-cli",
        "error_cb": errors,
        "logger": QUIET,  # librdkafka's lines repeat what error_cb delivers
        "socket.connection.setup.timeout.ms": int(CONNECT_TIMEOUT_S * 1000),
        **cluster.settings,
    }
    config.update(overrides or {})
    return config


def drain(producer: Producer, timeout_s: float) -> int:
    """Wait for outstanding deliveries; returns how many are still pending at the deadline.

    Like flush(), but through poll(): flush() turns a fatal client error (say, a broker
    without idempotence) into a SystemError from the next delivery callback, poll() raises
    it as the KafkaException it is.
    """
    deadline = time.monotonic() + timeout_s
    while len(producer) and time.monotonic() < deadline:
        producer.poll(0.05)
    return len(producer)


def wait_for_cluster(
    client: AdminClient, errors: ClientErrors, bootstrap: str, timeout_s: float = CONNECT_TIMEOUT_S
) -> ClusterMetadata:
    """Cluster metadata, or BrokerUnreachableError as soon as every bootstrap broker is down."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.list_topics(timeout=min(0.5, max(0.05, deadline - time.monotonic())))
        except KafkaException as exc:
            if kafka_error_code(exc) not in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT):
                raise
        client.poll(0)  # serves error_cb
        if errors.all_brokers_down:
            raise BrokerUnreachableError(f"Cannot reach a broker at {bootstrap}: {errors.cause()}.")
        if time.monotonic() >= deadline:
            raise BrokerUnreachableError(
                f"No broker answered at {bootstrap} within {timeout_s:g} s ({errors.cause()})."
            )


@dataclass
class AdminSession:
    """An AdminClient whose cluster answered, with the metadata it answered with."""

    admin: AdminClient
    errors: ClientErrors
    cluster: Cluster  # its address checked and normalised
    metadata: ClusterMetadata

    @property
    def bootstrap(self) -> str:
        return self.cluster.address

    def require_topic(self, topic: str) -> None:
        """TopicNotFoundError unless the topic exists (checked without auto-creating it)."""
        if topic not in self.metadata.topics:
            raise TopicNotFoundError(topic)


def connect_admin(cluster: Cluster) -> AdminSession:
    """An AdminClient on `cluster`, after checking that a broker answers."""
    cluster = replace(cluster, bootstrap=parse_bootstrap(cluster.address))
    errors = ClientErrors()
    admin = AdminClient(client_config(cluster, errors))
    metadata = wait_for_cluster(admin, errors, cluster.address)
    return AdminSession(admin, errors, cluster, metadata)


def result_of(future: concurrent.futures.Future[T], what: str) -> T:
    """An admin request's result, with a deadline; KafkaException passes through."""
    try:
        return future.result(timeout=REQUEST_TIMEOUT_S)
    except concurrent.futures.TimeoutError as exc:
        raise CliError(f"{what}: no answer within {REQUEST_TIMEOUT_S:g} s.") from exc
