"""`onceflow broker`: run the embedded Kafka-protocol broker in the foreground."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated

import typer


def _parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise typer.BadParameter(f"{listen!r} is not HOST:PORT", param_hint="--listen")
    return host.strip("[]") or "0.0.0.0", int(port)


def _parse_overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r} is not key=value", param_hint="--override")
        out[key.strip()] = value.strip()
    return out


def broker_command(
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="Where logs live [./onceflow-data].")
    ] = None,
    listen: Annotated[
        str | None, typer.Option("--listen", help="HOST:PORT to listen on [127.0.0.1:9092].")
    ] = None,
    advertised_host: Annotated[
        str | None, typer.Option("--advertised-host", help="Host name given to clients.")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML file of broker settings.")
    ] = None,
    fsync: Annotated[
        bool | None,
        typer.Option(
            "--fsync/--no-fsync",
            help="fsync before acknowledging acks=all [on]. --no-fsync is unsafe: benchmarks only.",
        ),
    ] = None,
    override: Annotated[
        list[str] | None,
        typer.Option("--override", "-o", help="A Kafka broker setting k=v (num.partitions=3)."),
    ] = None,
    log_level: Annotated[
        str, typer.Option("--log-level", help="DEBUG, INFO, WARNING or ERROR.")
    ] = "INFO",
) -> None:
    """Run a single-node Kafka-protocol broker in the foreground (SIGTERM/SIGINT stop it)."""
    # Imported here so that the other commands start without loading the broker.
    from onceflow.broker.config import ConfigError, load_config
    from onceflow.broker.data_dir import DataDirError
    from onceflow.broker.security import SecurityConfigError
    from onceflow.broker.server import serve_forever

    flags: dict[str, object] = {
        "data_dir": data_dir,
        "fsync": fsync,
        "advertised_host": advertised_host,
    }
    if listen is not None:
        flags["host"], flags["port"] = _parse_listen(listen)
    try:
        settings = load_config(config, _parse_overrides(override or []), **flags)
    except ConfigError as e:
        raise typer.BadParameter(str(e)) from None
    if listen is not None and settings.listeners:
        raise typer.BadParameter(
            "give --listen (one PLAINTEXT listener) or the listeners setting, not both"
        )
    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        asyncio.run(serve_forever(settings))
    except (DataDirError, SecurityConfigError) as e:
        typer.echo(f"onceflow broker: {e}", err=True)
        raise typer.Exit(code=1) from None
    except OSError as e:
        typer.echo(f"onceflow broker: {e.strerror or e}", err=True)
        raise typer.Exit(code=1) from None
