"""`onceflow run NAME`: run a bundled pipeline on a local Spark session (or `--master`)."""

from __future__ import annotations

import importlib
from typing import Annotated

import typer

PIPELINES = {
    "wordcount": "onceflow.pipelines.wordcount",
    "file-transactions": "onceflow.pipelines.file_transactions",
    "copy": "onceflow.pipelines.copy_topic",
    "mirror": "onceflow.pipelines.mirror",
}


def run_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help=f"One of: {', '.join(PIPELINES)}.")],
) -> None:
    """Run a bundled pipeline; its own options follow the name (NAME --help lists them)."""
    module = PIPELINES.get(name)
    if name in ("--help", "-h"):
        typer.echo("Usage: onceflow run NAME [OPTIONS]   (NAME --help for its options)")
        typer.echo(f"Pipelines: {', '.join(PIPELINES)}")
        return
    if module is None:
        raise typer.BadParameter(f"unknown pipeline {name!r}; choose from {', '.join(PIPELINES)}")
    importlib.import_module(module).main(ctx.args)
