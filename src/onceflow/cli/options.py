"""Shared pieces of the `onceflow` tools: options, Kafka client set-up, errors and output.

Every tool talks to the broker through confluent-kafka, so the same commands work against
onceflow's broker and against any Kafka cluster. Failures reach the user as one line on
stderr (exit 1 for a failure, 2 for a bad argument), never as a traceback.
"""

from __future__ import annotations

import concurrent.futures
import io
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ClusterMetadata
from rich import box
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from onceflow.client_properties import ClientPropertiesError, load_client_properties
from onceflow.librdkafka_log import QUIET

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
# Short on purpose: a tool pointed at the wrong address should say so in seconds.
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 15.0
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})

BootstrapServer = Annotated[
    str,
    typer.Option(
        "--bootstrap-server",
        "-b",
        metavar="HOST:PORT",
        help="Broker(s) to connect to, comma-separated.",
    ),
]

# What --command-config FILE loaded, for every client this invocation makes (client_config
# and cluster_security read it); set by the option's callback, reset by each invocation.
_command_settings: dict[str, str] = {}


def _load_command_config(value: Path | None) -> Path | None:
    _command_settings.clear()
    if value is not None:
        try:
            _command_settings.update(load_client_properties(value))
        except ClientPropertiesError as e:
            raise typer.BadParameter(str(e)) from None
    return value


CommandConfig = Annotated[
    Path | None,
    typer.Option(
        "--command-config",
        metavar="FILE",
        help="Client settings (security.protocol, sasl.*, ssl.*), a Kafka properties file.",
        callback=_load_command_config,
    ),
]


def command_settings() -> dict[str, str]:
    """The client settings --command-config gave (librdkafka's names), or none."""
    return dict(_command_settings)


def _client_settings(client: str) -> Any:
    """The repeatable `--{client}-property KEY=VALUE` option: librdkafka settings given on
    the command line over the tool's own (produce, consume and the benchmarks)."""
    return Annotated[
        list[str] | None,
        typer.Option(
            f"--{client}-property",
            metavar="KEY=VALUE",
            help=f"A librdkafka {client} setting (overrides the tool's); repeatable.",
        ),
    ]


ProducerProperties = _client_settings("producer")
ConsumerProperties = _client_settings("consumer")

T = TypeVar("T")


def command_group(help_text: str) -> typer.Typer:
    """A group of sub-commands (`onceflow topics ...`): its help when called bare."""
    return typer.Typer(help=help_text, no_args_is_help=True, add_completion=False)


class CliError(Exception):
    """A failure the user can act on: reported as one line on stderr."""

    exit_code = 1


class UsageError(CliError):
    """A bad argument, found after click's own parsing (same exit code as click's)."""

    exit_code = 2


class BrokerUnreachableError(CliError):
    """No broker answered at the bootstrap address."""


class TopicNotFoundError(CliError):
    """The named topic does not exist."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"Topic '{topic}' does not exist.")


def kafka_error_text(error: KafkaError | KafkaException) -> str:
    """One readable line for a Kafka error: the message and Kafka's error name."""
    if isinstance(error, KafkaException):
        if not error.args or not isinstance(error.args[0], KafkaError):
            return str(error)
        error = error.args[0]
    text = error.str().rstrip(".")
    return f"{text} ({error.name()})"


def error_text(error: CliError | KafkaException | OSError) -> str:
    """One line for a failure: Kafka's error name for a Kafka exception, else the message."""
    return kafka_error_text(error) if isinstance(error, KafkaException) else str(error)


def kafka_error_code(error: KafkaException) -> int | None:
    """The KafkaError code carried by an exception, if any."""
    if error.args and isinstance(error.args[0], KafkaError):
        return error.args[0].code()
    return None


# --- argument parsing ---------------------------------------------------------------------


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


def parse_pairs(values: Iterable[str], option: str) -> dict[str, str]:
    """`k=v` strings (as given to a repeatable option) to a dict; UsageError when malformed."""
    pairs: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"Invalid {option} '{item}': expected KEY=VALUE.")
        pairs[key.strip()] = value
    return pairs


def require_at_least(*checks: tuple[str, float | None, float]) -> None:
    """UsageError for the first (option, value, lowest) whose value is below its lowest (an
    option not given, None, passes)."""
    for name, value, low in checks:
        if value is not None and value < low:
            raise UsageError(f"{name} must be at least {low}, not {value}.")


def parse_bool(value: str, name: str) -> bool:
    """A Kafka-style boolean property value."""
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise UsageError(f"Invalid value '{value}' for {name}: expected true or false.")
    return lowered == "true"


# --- Kafka clients ------------------------------------------------------------------------


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
    bootstrap: str, errors: ClientErrors, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Base confluent-kafka configuration shared by every tool."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "client.id": "onceflow-cli",
        "error_cb": errors,
        "logger": QUIET,  # librdkafka's lines repeat what error_cb delivers
        "socket.connection.setup.timeout.ms": int(CONNECT_TIMEOUT_S * 1000),
        **_command_settings,
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
    bootstrap: str
    metadata: ClusterMetadata

    def require_topic(self, topic: str) -> None:
        """TopicNotFoundError unless the topic exists (checked without auto-creating it)."""
        if topic not in self.metadata.topics:
            raise TopicNotFoundError(topic)


def connect_admin(bootstrap: str) -> AdminSession:
    """An AdminClient on `bootstrap`, after checking that a broker answers."""
    bootstrap = parse_bootstrap(bootstrap)
    errors = ClientErrors()
    admin = AdminClient(client_config(bootstrap, errors))
    return AdminSession(admin, errors, bootstrap, wait_for_cluster(admin, errors, bootstrap))


def result_of(future: concurrent.futures.Future[T], what: str) -> T:
    """An admin request's result, with a deadline; KafkaException passes through."""
    try:
        return future.result(timeout=REQUEST_TIMEOUT_S)
    except concurrent.futures.TimeoutError as exc:
        raise CliError(f"{what}: no answer within {REQUEST_TIMEOUT_S:g} s.") from exc


# --- output -------------------------------------------------------------------------------


def stdout_console() -> Console:
    """Console for results; wide when piped, so tables stay one row per line."""
    console = Console(highlight=False, markup=False, soft_wrap=False)
    if not console.is_terminal:
        console = Console(highlight=False, markup=False, width=240)
    return console


def result_table(*columns: str, right_from: int | None = None) -> Table:
    """A plain table for results: a header rule, no borders, cells two or more spaces apart.

    Columns from index `right_from` on are right-aligned (figures line up by their digits).
    """
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for index, column in enumerate(columns):
        right = right_from is not None and index >= right_from
        table.add_column(column, justify="right" if right else "left")
    return table


def stderr_console() -> Console:
    """Console for progress and notes, kept off stdout so results can be piped."""
    return Console(stderr=True, highlight=False, markup=False)


def note(message: str) -> None:
    """A one-line remark on stderr (warnings, dry-run notices)."""
    print(message, file=sys.stderr, flush=True)


def error_line(message: str) -> None:
    print(f"Error: {message}", file=sys.stderr, flush=True)


class OnceflowGroup(TyperGroup):
    """The root command group: turns every failure into one line on stderr.

    Click's usage errors, the tools' own CliError and Kafka client exceptions are caught
    here, at the edge, so no command prints a traceback for a user's mistake.
    """

    def main(  # type: ignore[override]
        self, args: Sequence[str] | None = None, *more: Any, **extra: Any
    ) -> Any:
        if extra.get("standalone_mode", True) is False:
            return super().main(args, *more, **extra)
        extra["standalone_mode"] = False
        try:
            outcome = super().main(args, *more, **extra)
        except typer.TyperException as exc:  # click's exceptions, as vendored by typer
            if type(exc).__name__ == "NoArgsIsHelpError":
                sys.exit(exc.exit_code)  # the help is already printed
            sys.exit(_report(_usage_text(exc), exc.exit_code))
        except CliError as exc:
            sys.exit(_report(str(exc), exc.exit_code))
        except KafkaException as exc:
            sys.exit(_report(kafka_error_text(exc), 1))
        except typer.Abort:
            sys.exit(_report("Aborted.", 130))
        except KeyboardInterrupt:
            sys.exit(130)
        except BrokenPipeError:
            _silence_stdout()
            sys.exit(1)
        sys.exit(outcome if isinstance(outcome, int) else 0)


def _silence_stdout() -> None:
    """The reader went away (`| head`): point stdout at /dev/null so the exit flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation) as exc:
        note(f"stdout closed: {exc}")


def _usage_text(exc: typer.TyperException) -> str:
    ctx = getattr(exc, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    return f"{exc.format_message()}{hint}"


def _report(message: str, code: int) -> int:
    error_line(message)
    return code
