"""The `onceflow` tools' shared options: the bootstrap address and --command-config of every
command that talks to a cluster, librdkafka settings on the command line, and the parsing of
option values (tools/option_values.py: a bad one is a UsageError, one line, exit 2)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from onceflow.client_properties import ClientPropertiesError, load_client_properties
from onceflow.tools.clients import DEFAULT_BOOTSTRAP, Cluster

BootstrapServer = Annotated[
    str,
    typer.Option(
        "--bootstrap-server",
        "-b",
        metavar="HOST:PORT",
        help="Broker(s) to connect to, comma-separated.",
    ),
]


def _check_command_config(value: Path | None) -> Path | None:
    """An unusable file is a usage error of the option (exit 2), before the command runs."""
    try:
        if value is not None:
            load_client_properties(value)
    except ClientPropertiesError as e:
        raise typer.BadParameter(str(e)) from None
    return value


CommandConfig = Annotated[
    Path | None,
    typer.Option(
        "--command-config",
        metavar="FILE",
        help="Client settings (security.protocol, sasl.*, ssl.*), a Kafka properties file.",
        callback=_check_command_config,
    ),
]


Command = Callable[..., None]


def option(name: str, annotation: Any, default: Any = None) -> inspect.Parameter:
    """One option of an option_group, as a command's parameter would declare it."""
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


def option_group(
    into: str,
    options: Sequence[inspect.Parameter],
    combine: Callable[..., Any],
    *,
    first: bool = False,
) -> Callable[[Command], Command]:
    """Options that several commands share, declared once (click's shared-option decorators,
    for typer): `options` are added after the command's own (before them with `first`), and
    the command's parameter `into` gets `combine(**their values)` in their place."""
    names = [one.name for one in options]

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        own = [one for one in signature.parameters.values() if one.name != into]
        # Keyword-only (typer passes every value by name), so that any order is a signature.
        parameters = [
            one.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for one in ([*options, *own] if first else [*own, *options])
        ]

        @functools.wraps(command)
        def run(**kwargs: Any) -> None:
            values = {name: kwargs.pop(name) for name in names}
            command(**{into: combine(**values)}, **kwargs)

        # typer reads the options from the signature and the type hints: give it real objects.
        run.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {one.name: one.annotation for one in parameters}
        return run

    return decorate


def cluster_command(
    bootstrap: Any = BootstrapServer,
    default: str | None = DEFAULT_BOOTSTRAP,
    *,
    into: str = "cluster",
) -> Callable[[Command], Command]:
    """A command that talks to a cluster: `-b/--bootstrap-server` (`bootstrap` with `default`)
    and `--command-config` come after its own options, as every tool lists them, and reach
    the command as one value, `cluster: Cluster` (the address and the client settings; `into`
    names the parameter), which it hands to the tool functions: no setting outlives the
    command. The command connects itself once its arguments are checked, so a bad argument
    is reported before an unreachable broker."""
    return option_group(
        into,
        [option("bootstrap_server", bootstrap, default), option("command_config", CommandConfig)],
        lambda bootstrap_server, command_config: Cluster.from_options(
            bootstrap_server, command_config
        ),
    )


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


def command_group(help_text: str) -> typer.Typer:
    """A group of sub-commands (`onceflow topics ...`): its help when called bare."""
    return typer.Typer(help=help_text, no_args_is_help=True, add_completion=False)
