"""`onceflow produce` and `onceflow consume`: stdin to a topic and a topic to stdout.

They follow kafka-console-producer.sh and kafka-console-consumer.sh: the same `--property`
names (parse.key, key.separator, print.key, ...), the same defaults (tab as key separator,
read_uncommitted, start at the end unless --from-beginning) and the same error texts.
"""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, BinaryIO

import typer
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_STORED,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)

from onceflow.cli.options import (
    ConsumerProperties,
    ProducerProperties,
    cluster_command,
)
from onceflow.tools.clients import ClientErrors, Cluster, client_config, connect_admin, drain
from onceflow.tools.errors import CliError, TopicNotFoundError, UsageError, kafka_error_text
from onceflow.tools.option_values import parse_bool, parse_pairs, require_at_least
from onceflow.tools.output import note

# Deliveries still pending this long after stdin closed are reported as failed.
DELIVERY_TIMEOUT_MS = 30_000
CONSUME_BATCH = 500
POLL_INTERVAL_S = 0.2


class Acks(StrEnum):
    all = "all"
    minus_one = "-1"
    zero = "0"
    one = "1"


class Compression(StrEnum):
    none = "none"
    gzip = "gzip"
    snappy = "snappy"
    lz4 = "lz4"
    zstd = "zstd"


class Isolation(StrEnum):
    read_uncommitted = "read_uncommitted"
    read_committed = "read_committed"


Properties = Annotated[
    list[str] | None,
    typer.Option(
        "--property", metavar="KEY=VALUE", help="Reader/formatter property as in Kafka's tools."
    ),
]


def _separator(text: str, option: str) -> bytes:
    if not text:
        raise UsageError(f"{option} must not be empty.")
    return text.encode()


# --- produce ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LineFormat:
    """How a stdin line becomes a record (Kafka's LineMessageReader properties)."""

    parse_key: bool = False
    key_separator: bytes = b"\t"
    ignore_error: bool = False

    @classmethod
    def from_properties(cls, properties: dict[str, str], key_separator: str | None) -> LineFormat:
        unknown = set(properties) - {"parse.key", "key.separator", "ignore.error"}
        if unknown:
            raise UsageError(
                f"Unknown --property {', '.join(sorted(unknown))}: "
                "produce understands parse.key, key.separator, ignore.error."
            )
        separator = key_separator if key_separator is not None else properties.get("key.separator")
        parse_key = parse_bool(properties.get("parse.key", "false"), "parse.key")
        return cls(
            # --key-separator alone means the lines carry keys.
            parse_key=parse_key or key_separator is not None,
            key_separator=_separator(separator, "key.separator") if separator else b"\t",
            ignore_error=parse_bool(properties.get("ignore.error", "false"), "ignore.error"),
        )

    def parse(self, line: bytes, number: int) -> tuple[bytes | None, bytes]:
        """(key, value) of one line, without its line terminator."""
        if not self.parse_key:
            return None, line
        key, sep, value = line.partition(self.key_separator)
        if sep:
            return key, value
        if self.ignore_error:
            return None, line
        text = line.decode(errors="replace")
        raise CliError(f"No key separator found on line number {number}: '{text}'")


@dataclass
class DeliveryTally:
    """Counts delivery reports; keeps the first failure to explain the rest."""

    sent: int = 0
    delivered: int = 0
    failed: int = 0
    first_error: KafkaError | None = None

    def __call__(self, error: KafkaError | None, _message: Message) -> None:
        if error is None:
            self.delivered += 1
            return
        self.failed += 1
        if self.first_error is None:
            self.first_error = error
            note(f"Error when sending a record: {kafka_error_text(error)}")

    @property
    def pending(self) -> int:
        return self.sent - self.delivered - self.failed


@cluster_command()
def produce_command(
    cluster: Cluster,
    topic: Annotated[str, typer.Argument(metavar="TOPIC", help="Topic to write to.")],
    properties: Properties = None,
    key_separator: Annotated[
        str | None,
        typer.Option("--key-separator", help="Lines are KEY<sep>VALUE (implies parse.key=true)."),
    ] = None,
    parse_key: Annotated[
        bool, typer.Option("--parse-key", help="Lines are KEY<tab>VALUE.")
    ] = False,
    acks: Annotated[Acks, typer.Option("--acks", help="Acknowledgements to wait for.")] = Acks.all,
    compression: Annotated[
        Compression, typer.Option("--compression", help="Batch compression codec.")
    ] = Compression.none,
    producer_property: ProducerProperties = None,
) -> None:
    """Write each line of stdin to TOPIC as one record (idempotent producer)."""
    props = parse_pairs(properties or [], "--property")
    if parse_key:
        props.setdefault("parse.key", "true")
    line_format = LineFormat.from_properties(props, key_separator)
    overrides = parse_pairs(producer_property or [], "--producer-property")
    session = connect_admin(cluster)
    session.require_topic(topic)

    tally = DeliveryTally()
    errors = ClientErrors()
    # Kafka turns idempotence off implicitly when acks is not all; so do we.
    idempotent = acks in (Acks.all, Acks.minus_one)
    config = client_config(
        session.cluster,
        errors,
        {
            "acks": acks.value,
            "enable.idempotence": idempotent,
            "compression.type": compression.value,
            "linger.ms": 5,
            "delivery.timeout.ms": DELIVERY_TIMEOUT_MS,
            "on_delivery": tally,
            **overrides,
        },
    )
    producer = Producer(config)
    try:
        for number, line in enumerate(_stdin_lines(), start=1):
            key, value = line_format.parse(line, number)
            _send(producer, topic, key, value)
            tally.sent += 1
    except CliError:
        # A bad line stops the tool, as in Kafka's; the lines before it are still delivered.
        drain(producer, DELIVERY_TIMEOUT_MS / 1000 + 5)
        raise
    drain(producer, DELIVERY_TIMEOUT_MS / 1000 + 5)
    errors.raise_if_fatal()
    if tally.failed or tally.pending:
        cause = kafka_error_text(tally.first_error) if tally.first_error else "timed out"
        raise CliError(
            f"{tally.failed + tally.pending} of {tally.sent} records were not delivered "
            f"to '{topic}': {cause}."
        )


def _stdin_lines() -> Iterable[bytes]:
    for raw in sys.stdin.buffer:
        yield raw.rstrip(b"\n").rstrip(b"\r")


def _send(producer: Producer, topic: str, key: bytes | None, value: bytes) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key)
            break
        except BufferError:
            # The local queue is full: let deliveries drain, then retry this record.
            producer.poll(0.05)
    producer.poll(0)


# --- consume ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordFormat:
    """How a record is printed (Kafka's DefaultMessageFormatter properties)."""

    print_timestamp: bool = False
    print_partition: bool = False
    print_offset: bool = False
    print_key: bool = False
    print_value: bool = True
    key_separator: bytes = b"\t"
    line_separator: bytes = b"\n"
    null_literal: bytes = b"null"

    _BOOLEANS = ("print.timestamp", "print.partition", "print.offset", "print.key", "print.value")
    _TEXTS = ("key.separator", "line.separator", "null.literal")

    @classmethod
    def from_options(
        cls, properties: dict[str, str], print_key: bool, key_separator: str | None
    ) -> RecordFormat:
        unknown = set(properties) - set(cls._BOOLEANS) - set(cls._TEXTS)
        if unknown:
            raise UsageError(
                f"Unknown --property {', '.join(sorted(unknown))}: consume understands "
                f"{', '.join(cls._BOOLEANS + cls._TEXTS)}."
            )
        values: dict[str, Any] = {
            name.replace(".", "_"): parse_bool(properties[name], name)
            for name in cls._BOOLEANS
            if name in properties
        }
        for name in cls._TEXTS:
            if name in properties:
                values[name.replace(".", "_")] = properties[name].encode()
        if print_key:
            values["print_key"] = True
        if key_separator is not None:
            values["key_separator"] = _separator(key_separator, "--key-separator")
        return cls(**values)

    def render(self, message: Message) -> bytes:
        fields: list[bytes] = []
        if self.print_timestamp:
            kind, stamp = message.timestamp()
            names = {
                TIMESTAMP_CREATE_TIME: "CreateTime",
                TIMESTAMP_LOG_APPEND_TIME: "LogAppendTime",
            }
            fields.append(f"{names[kind]}:{stamp}".encode() if kind in names else b"NO_TIMESTAMP")
        if self.print_partition:
            fields.append(f"Partition:{message.partition()}".encode())
        if self.print_offset:
            fields.append(f"Offset:{message.offset()}".encode())
        if self.print_key:
            key = message.key()
            fields.append(self.null_literal if key is None else key)
        if self.print_value:
            value = message.value()
            fields.append(self.null_literal if value is None else value)
        return self.key_separator.join(fields) + self.line_separator


@dataclass
class ConsumeLimits:
    """When the consume loop stops: after max_messages, or after idle_s without a record."""

    max_messages: int | None
    idle_s: float | None
    started: float = field(default_factory=time.monotonic)

    def batch_size(self, consumed: int) -> int:
        if self.max_messages is None:
            return CONSUME_BATCH
        return min(CONSUME_BATCH, self.max_messages - consumed)

    def idle_for_too_long(self, last_record_at: float) -> bool:
        return self.idle_s is not None and time.monotonic() - last_record_at >= self.idle_s


@cluster_command()
def consume_command(
    cluster: Cluster,
    topic: Annotated[str, typer.Argument(metavar="TOPIC", help="Topic to read from.")],
    group: Annotated[
        str | None,
        typer.Option("--group", help="Consumer group (offsets are committed to it)."),
    ] = None,
    from_beginning: Annotated[
        bool,
        typer.Option("--from-beginning", help="Start at the earliest offset if none committed."),
    ] = False,
    max_messages: Annotated[
        int | None, typer.Option("--max-messages", help="Stop after this many records.")
    ] = None,
    timeout_ms: Annotated[
        int | None,
        typer.Option("--timeout-ms", help="Stop after this long without a record."),
    ] = None,
    isolation_level: Annotated[
        Isolation, typer.Option("--isolation-level", help="Whether to see uncommitted records.")
    ] = Isolation.read_uncommitted,
    print_key: Annotated[bool, typer.Option("--print-key", help="Print keys too.")] = False,
    key_separator: Annotated[
        str | None,
        typer.Option("--key-separator", help="Between printed fields (default: tab)."),
    ] = None,
    partition: Annotated[
        int | None, typer.Option("--partition", help="Read only this partition.")
    ] = None,
    properties: Properties = None,
    consumer_property: ConsumerProperties = None,
) -> None:
    """Print records of TOPIC to stdout, one per line."""
    require_at_least(
        ("--max-messages", max_messages, 1),
        ("--timeout-ms", timeout_ms, 0),
        ("--partition", partition, 0),
    )
    record_format = RecordFormat.from_options(
        parse_pairs(properties or [], "--property"), print_key, key_separator
    )
    overrides = parse_pairs(consumer_property or [], "--consumer-property")
    session = connect_admin(cluster)
    session.require_topic(topic)
    partitions = sorted(session.metadata.topics[topic].partitions)
    if partition is not None and partition not in partitions:
        raise CliError(f"Partition {partition} of topic '{topic}' does not exist.")

    errors = ClientErrors()
    config = client_config(
        session.cluster,
        errors,
        {
            # Without --group the consumer only assigns partitions; the id is never joined.
            "group.id": group or f"onceflow-console-consumer-{secrets.token_hex(4)}",
            "enable.auto.commit": group is not None,
            # Offsets are stored only for printed records, so a commit never skips one.
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest" if from_beginning else "latest",
            "isolation.level": isolation_level.value,
            **overrides,
        },
    )
    consumer = Consumer(config)
    if group is not None and partition is None:
        consumer.subscribe([topic])
    else:
        if group is not None:
            start = OFFSET_STORED
        else:
            start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        chosen = [partition] if partition is not None else partitions
        consumer.assign([TopicPartition(topic, p, start) for p in chosen])

    limits = ConsumeLimits(max_messages, timeout_ms / 1000 if timeout_ms is not None else None)
    consumed = 0
    try:
        consumed = _consume_loop(
            consumer, errors, topic, record_format, limits, sys.stdout.buffer, group is not None
        )
    finally:
        consumer.close()
        note(f"Processed a total of {consumed} messages")


def _consume_loop(
    consumer: Consumer,
    errors: ClientErrors,
    topic: str,
    record_format: RecordFormat,
    limits: ConsumeLimits,
    out: BinaryIO,
    store_offsets: bool,
) -> int:
    consumed = 0
    last_record_at = limits.started
    try:
        while limits.max_messages is None or consumed < limits.max_messages:
            batch = consumer.consume(
                num_messages=limits.batch_size(consumed), timeout=POLL_INTERVAL_S
            )
            errors.raise_if_fatal()
            printed = 0
            for message in batch:
                if message.error() is not None:
                    _check_message_error(message.error(), topic)
                    continue
                out.write(record_format.render(message))
                if store_offsets:
                    consumer.store_offsets(message=message)
                printed += 1
            if printed:
                out.flush()
                consumed += printed
                last_record_at = time.monotonic()
            elif limits.idle_for_too_long(last_record_at):
                break
    except KeyboardInterrupt:
        # Ctrl-C is the usual way to stop a console consumer: close and report, as Kafka does.
        pass
    return consumed


def _check_message_error(error: KafkaError, topic: str) -> None:
    if error.code() == KafkaError._PARTITION_EOF:
        return
    if error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
        raise TopicNotFoundError(topic)
    if error.fatal():
        raise CliError(f"Fatal consumer error: {kafka_error_text(error)}")
    note(f"Warning: {kafka_error_text(error)}")
