"""`onceflow broker`: run the embedded Kafka-protocol broker in the foreground."""

from __future__ import annotations

from pathlib import Path

import typer


def broker_command(
    data_dir: Path = typer.Option(Path("onceflow-data"), "--data-dir", help="Where logs live."),
    listen: str = typer.Option("127.0.0.1:9092", "--listen", help="HOST:PORT to listen on."),
    config: Path | None = typer.Option(None, "--config", help="TOML file of broker settings."),
    fsync: bool = typer.Option(True, "--fsync/--no-fsync", help="fsync before acks=all."),
    override: list[str] = typer.Option([], "--override", "-o", help="Kafka setting k=v."),
) -> None:
    """Run a single-node Kafka-protocol broker in the foreground."""
    raise typer.Exit(code=1)  # replaced by the broker work
