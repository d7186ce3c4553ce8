"""Broker settings, named as Kafka names them, from defaults < TOML file < CLI flags."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from onceflow.groups.config import ConsumerGroupMigrationPolicy
from onceflow.log.config import parse_cleanup_policy
from onceflow.log.errors import LogConfigError
from onceflow.metrics.listen import MetricsListenError, parse_listen
from onceflow.records.varint import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN
from onceflow.security.authorizer import AUTHORIZER_CLASS_NAMES
from onceflow.security.listeners import (
    DEFAULT_PROTOCOL_MAP,
    Listener,
    ListenerError,
    SecurityProtocol,
    parse_listeners,
    parse_protocol_map,
)
from onceflow.security.sasl import SUPPORTED_MECHANISMS


class ConfigError(ValueError):
    """A setting that does not exist or has a value of the wrong kind."""


def _kafka(name: str, default: Any, *, sensitive: bool = False) -> Any:
    return field(default=default, metadata={"kafka": name, "sensitive": sensitive})


@dataclass(frozen=True)
class BrokerConfig:
    data_dir: Path = Path("onceflow-data")
    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str | None = None
    fsync: bool = True  # fsync before acknowledging acks=all (off is unsafe: benchmarks only)
    node_id: int = _kafka("node.id", 0)
    num_partitions: int = _kafka("num.partitions", 1)
    auto_create_topics_enable: bool = _kafka("auto.create.topics.enable", True)
    default_replication_factor: int = _kafka("default.replication.factor", 1)
    socket_request_max_bytes: int = _kafka("socket.request.max.bytes", 100 * 1024 * 1024)
    message_max_bytes: int = _kafka("message.max.bytes", 1048588)
    # not a Kafka setting: the decompressed bytes one Produce batch may expand to (bombs)
    message_max_decompressed_bytes: int = 64 << 20  # set as message.max.decompressed.bytes
    log_segment_bytes: int = _kafka("log.segment.bytes", 1 << 30)
    log_roll_ms: int = _kafka("log.roll.ms", 7 * 24 * 3600 * 1000)
    log_retention_ms: int = _kafka("log.retention.ms", 7 * 24 * 3600 * 1000)
    log_retention_bytes: int = _kafka("log.retention.bytes", -1)
    log_retention_check_interval_ms: int = _kafka("log.retention.check.interval.ms", 300_000)
    log_index_interval_bytes: int = _kafka("log.index.interval.bytes", 4096)
    log_message_timestamp_type: str = _kafka("log.message.timestamp.type", "CreateTime")
    # Defaults for the topics' cleanup.policy and compaction settings (a topic's own value wins).
    log_cleanup_policy: str = _kafka("log.cleanup.policy", "delete")
    log_cleaner_enable: bool = _kafka("log.cleaner.enable", True)
    # Kafka allows several; onceflow's cleaner is one background task, so only 1 is accepted.
    log_cleaner_threads: int = _kafka("log.cleaner.threads", 1)
    log_cleaner_backoff_ms: int = _kafka("log.cleaner.backoff.ms", 15_000)
    log_cleaner_dedupe_buffer_size: int = _kafka("log.cleaner.dedupe.buffer.size", 134_217_728)
    log_cleaner_io_buffer_load_factor: float = _kafka("log.cleaner.io.buffer.load.factor", 0.9)
    log_cleaner_min_cleanable_ratio: float = _kafka("log.cleaner.min.cleanable.ratio", 0.5)
    log_cleaner_delete_retention_ms: int = _kafka("log.cleaner.delete.retention.ms", 86_400_000)
    log_cleaner_min_compaction_lag_ms: int = _kafka("log.cleaner.min.compaction.lag.ms", 0)
    log_cleaner_max_compaction_lag_ms: int = _kafka(
        "log.cleaner.max.compaction.lag.ms", (1 << 63) - 1
    )
    group_initial_rebalance_delay_ms: int = _kafka("group.initial.rebalance.delay.ms", 3000)
    group_min_session_timeout_ms: int = _kafka("group.min.session.timeout.ms", 6000)
    group_max_session_timeout_ms: int = _kafka("group.max.session.timeout.ms", 1_800_000)
    group_consumer_session_timeout_ms: int = _kafka("group.consumer.session.timeout.ms", 45_000)
    group_consumer_heartbeat_interval_ms: int = _kafka(
        "group.consumer.heartbeat.interval.ms", 5_000
    )
    group_consumer_max_size: int = _kafka("group.consumer.max.size", 2_147_483_647)
    group_consumer_migration_policy: str = _kafka(
        "group.consumer.migration.policy", "bidirectional"
    )
    offsets_retention_minutes: int = _kafka("offsets.retention.minutes", 7 * 24 * 60)
    # The internal logs' segment.bytes (they are compacted: only rolled segments are cleaned).
    # A start replays the offsets log's active segment at about 50,000 records/s, so onceflow's
    # default is a tenth of Kafka's 100 MiB: about 3 s of replay at most instead of 30.
    offsets_topic_segment_bytes: int = _kafka("offsets.topic.segment.bytes", 10 * 1024 * 1024)
    transaction_state_log_segment_bytes: int = _kafka(
        "transaction.state.log.segment.bytes", 104_857_600
    )
    transaction_max_timeout_ms: int = _kafka("transaction.max.timeout.ms", 900_000)
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = _kafka(
        "transaction.abort.timed.out.transaction.cleanup.interval.ms", 10_000
    )
    producer_id_expiration_ms: int = _kafka("producer.id.expiration.ms", 86_400_000)
    # The finalized level of Kafka's feature transaction.version (kafka-features in Kafka): 2
    # offers clients transactions version 2 (KIP-890 part 2), 0 or 1 the classic protocol.
    transaction_version: int = _kafka("transaction.version", 2)
    # Threads that open (recover), create and close partition logs at start, CreateTopics and
    # stop. Kafka's default is 2 (4.0): its threads also do the CPU work; ours mostly wait on
    # fsync (the GIL holds the CPU part to one core), and fsyncs in flight together share
    # the disk's journal commits, so more of them pay: see README, Limits.
    num_recovery_threads_per_data_dir: int = _kafka("num.recovery.threads.per.data.dir", 2)
    # Connections and the memory a client can hold (see broker/connection.py).
    fetch_max_bytes: int = _kafka("fetch.max.bytes", 57_671_680)
    connections_max_idle_ms: int = _kafka("connections.max.idle.ms", 600_000)
    max_connections: int = _kafka("max.connections", 2_147_483_647)
    max_connections_per_ip: int = _kafka("max.connections.per.ip", 2_147_483_647)
    max_connections_per_ip_overrides: str = _kafka("max.connections.per.ip.overrides", "")
    # Kafka's default is -1 (unbounded); a finite pool (twice socket.request.max.bytes: any legal
    # request still fits, with room for many ~1 MB produce requests) bounds half-received frames.
    queued_max_request_bytes: int = _kafka("queued.max.request.bytes", 200 * 1024 * 1024)
    # Kafka's default is 50, for an acceptor thread that does nothing else; ours shares the
    # event loop with requests, so a burst waits in the backlog (Linux caps it at somaxconn,
    # 4096 by default since 5.4).
    socket_listen_backlog_size: int = _kafka("socket.listen.backlog.size", 4096)
    # Security (security/): listeners, TLS, SASL. With `listeners` empty the broker has one
    # PLAINTEXT listener on host:port (--listen), as before.
    listeners: str = _kafka("listeners", "")
    advertised_listeners: str = _kafka("advertised.listeners", "")
    listener_security_protocol_map: str = _kafka(
        "listener.security.protocol.map", DEFAULT_PROTOCOL_MAP
    )
    ssl_keystore_type: str = _kafka("ssl.keystore.type", "PEM")
    ssl_keystore_location: str = _kafka("ssl.keystore.location", "")
    ssl_key_password: str = _kafka("ssl.key.password", "", sensitive=True)
    ssl_truststore_type: str = _kafka("ssl.truststore.type", "PEM")
    ssl_truststore_location: str = _kafka("ssl.truststore.location", "")
    ssl_client_auth: str = _kafka("ssl.client.auth", "none")
    ssl_enabled_protocols: str = _kafka("ssl.enabled.protocols", "TLSv1.2,TLSv1.3")
    # Kafka's default is GSSAPI, which onceflow does not offer; PLAIN is opt-in (it sends the
    # password itself, safe only inside TLS).
    sasl_enabled_mechanisms: str = _kafka("sasl.enabled.mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512")
    # The largest frame a SASL connection may send before it has authenticated (Kafka's
    # default); a larger one closes the connection.
    sasl_server_max_receive_size: int = _kafka("sasl.server.max.receive.size", 524_288)
    connection_failed_authentication_delay_ms: int = _kafka(
        "connection.failed.authentication.delay.ms", 100
    )
    # ACLs (security/authorizer.py): on only with one of Kafka's authorizer class names.
    authorizer_class_name: str = _kafka("authorizer.class.name", "")
    super_users: str = _kafka("super.users", "")
    allow_everyone_if_no_acl_found: bool = _kafka("allow.everyone.if.no.acl.found", False)
    # Not Kafka's (it has JMX): HOST:PORT of the Prometheus endpoint (onceflow.metrics), off
    # when empty. Off by default: no port taken unasked, nothing exposed without auth.
    metrics_listen: str = ""  # set as metrics.listen

    def __post_init__(self) -> None:
        _check_cleaner_settings(self)
        self.listener_list()  # fails now, with the setting named, rather than at start
        self.advertised_listener_list()
        self.enabled_mechanisms()
        if self.sasl_server_max_receive_size < 1:
            raise ConfigError("setting 'sasl.server.max.receive.size' must be at least 1")
        if self.connection_failed_authentication_delay_ms < 0:
            raise ConfigError("setting 'connection.failed.authentication.delay.ms' is negative")
        self.authorizer_enabled()
        self.metrics_address()
        try:
            ConsumerGroupMigrationPolicy.parse(self.group_consumer_migration_policy)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if self.transaction_version not in (0, 1, 2):
            raise ConfigError(
                f"setting 'transaction.version': {self.transaction_version} is not 0, 1 or 2"
            )

    def authorizer_enabled(self) -> bool:
        name = self.authorizer_class_name.strip()
        if name and name not in AUTHORIZER_CLASS_NAMES:
            raise ConfigError(
                f"authorizer.class.name={name}: onceflow's authorizer answers to "
                f"{' or '.join(AUTHORIZER_CLASS_NAMES)}"
            )
        return bool(name)

    def metrics_address(self) -> tuple[str, int] | None:
        """(host, port) of `metrics.listen`, None when the endpoint is off."""
        try:
            return parse_listen(self.metrics_listen)
        except MetricsListenError as e:
            raise ConfigError(str(e)) from None

    def listener_list(self) -> list[Listener]:
        """`listeners`, or the one PLAINTEXT listener of --listen (host, port)."""
        if not self.listeners.strip():
            return [Listener("PLAINTEXT", SecurityProtocol.PLAINTEXT, self.host, self.port)]
        try:
            return parse_listeners(self.listeners, self._protocol_map())
        except ListenerError as e:
            raise ConfigError(str(e)) from None

    def advertised_listener_list(self) -> list[Listener] | None:
        if not self.advertised_listeners.strip():
            return None
        try:
            return parse_listeners(
                self.advertised_listeners, self._protocol_map(), "advertised.listeners"
            )
        except ListenerError as e:
            raise ConfigError(str(e)) from None

    def enabled_mechanisms(self) -> tuple[str, ...]:
        names = tuple(
            m.strip().upper() for m in self.sasl_enabled_mechanisms.split(",") if m.strip()
        )
        unsupported = [m for m in names if m not in SUPPORTED_MECHANISMS]
        if unsupported:
            raise ConfigError(
                f"sasl.enabled.mechanisms: {', '.join(unsupported)} not supported by onceflow "
                f"(it offers {', '.join(SUPPORTED_MECHANISMS)})"
            )
        return names

    def _protocol_map(self) -> dict[str, SecurityProtocol]:
        try:
            return parse_protocol_map(self.listener_security_protocol_map)
        except ListenerError as e:
            raise ConfigError(str(e)) from None

    @property
    def advertised(self) -> str:
        return self.advertised_host or self.host

    def with_settings(self, settings: dict[str, Any]) -> BrokerConfig:
        """Apply Kafka-named (or onceflow field-named) settings; unknown names are errors."""
        by_name = {f.metadata.get("kafka", f.name): f for f in fields(self)}
        by_name.update({f.name.replace("_", "."): f for f in fields(self)})
        changes: dict[str, Any] = {}
        for name, raw in settings.items():
            if name == "log.retention.hours":  # Kafka's coarser alias, an INT
                hours = _coerce(name, raw, int)
                if not INT32_MIN <= hours <= INT32_MAX:
                    raise ConfigError(f"setting {name!r}: {raw!r} is not a number of type INT")
                changes["log_retention_ms"] = hours * 3_600_000
                continue
            f = by_name.get(name)
            if f is None:
                raise ConfigError(f"unknown broker setting {name!r}")
            changes[f.name] = _coerce(name, raw, type(getattr(self, f.name)))
        return replace(self, **changes)

    def kafka_settings(self) -> dict[str, str]:
        """The settings DescribeConfigs reports for the broker resource (passwords left out:
        no secret leaves the broker)."""
        out = {}
        for f in fields(self):
            if "kafka" in f.metadata and not f.metadata["sensitive"]:
                value = getattr(self, f.name)
                out[f.metadata["kafka"]] = (
                    str(value).lower() if isinstance(value, bool) else str(value)
                )
        return out


def _check_cleaner_settings(config: BrokerConfig) -> None:
    """Kafka's ranges for the log.cleaner.* settings (KafkaConfig's ConfigDef and
    CleanerConfig), and onceflow's one cleaner thread."""
    try:
        parse_cleanup_policy("log.cleanup.policy", config.log_cleanup_policy)
    except LogConfigError as e:
        raise ConfigError(str(e)) from None
    if config.log_cleaner_threads != 1:
        raise ConfigError(
            f"log.cleaner.threads={config.log_cleaner_threads}: onceflow runs one log cleaner "
            "(a background task), so only 1 is accepted"
        )
    at_least = {
        "log.cleaner.backoff.ms": (config.log_cleaner_backoff_ms, 0),
        "log.cleaner.delete.retention.ms": (config.log_cleaner_delete_retention_ms, 0),
        "log.cleaner.min.compaction.lag.ms": (config.log_cleaner_min_compaction_lag_ms, 0),
        "log.cleaner.max.compaction.lag.ms": (config.log_cleaner_max_compaction_lag_ms, 1),
        # CleanerConfig: at least 1 MiB of dedupe buffer per cleaner thread
        "log.cleaner.dedupe.buffer.size": (config.log_cleaner_dedupe_buffer_size, 1 << 20),
        # Kafka: at least 1, then the segment.bytes they become must be at least 14
        "offsets.topic.segment.bytes": (config.offsets_topic_segment_bytes, 14),
        "transaction.state.log.segment.bytes": (config.transaction_state_log_segment_bytes, 14),
        "num.recovery.threads.per.data.dir": (config.num_recovery_threads_per_data_dir, 1),
    }
    for name, (value, minimum) in at_least.items():
        if value < minimum:
            raise ConfigError(f"setting {name!r}: {value} is below the minimum {minimum}")
    if not 0 <= config.log_cleaner_min_cleanable_ratio <= 1:
        raise ConfigError(
            "setting 'log.cleaner.min.cleanable.ratio': "
            f"{config.log_cleaner_min_cleanable_ratio} is not between 0 and 1"
        )
    if not 0 < config.log_cleaner_io_buffer_load_factor <= 1:
        raise ConfigError(
            "setting 'log.cleaner.io.buffer.load.factor': "
            f"{config.log_cleaner_io_buffer_load_factor} is not in (0, 1]"
        )


def _coerce(name: str, raw: Any, kind: type) -> Any:
    try:
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("true", "false"):
                return str(raw).lower() == "true"
            raise ValueError(raw)
        if kind is Path:
            return Path(raw)
        if kind is type(None):
            return str(raw)
        value = kind(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"setting {name!r}: {raw!r} is not a valid {kind.__name__}") from None
    # Kafka's widest type is LONG: a value past it would only fail later, in a topic's
    # configs or an int64 field (every CreateTopics refused), so it is refused at start
    if kind is int and not INT64_MIN <= value <= INT64_MAX:
        raise ConfigError(f"setting {name!r}: {raw!r} is not a number of type LONG")
    return value


def load_config(
    path: Path | None = None, overrides: dict[str, Any] | None = None, **flags: Any
) -> BrokerConfig:
    """Defaults, then the TOML file (flat Kafka names, or tables joined with dots), then flags."""
    settings: dict[str, Any] = {}
    if path is not None:
        try:
            with path.open("rb") as f:
                settings.update(_flatten(tomllib.load(f)))
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path}: {e}") from None
    settings.update(overrides or {})
    config = BrokerConfig().with_settings(settings)
    flag_values = {k: v for k, v in flags.items() if v is not None}
    return replace(config, **flag_values)


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out
