"""The `onceflow` command line's root group: every failure becomes one line on stderr (exit 1
for a failure, 2 for a bad argument), never a traceback."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Sequence
from typing import Any

import typer
from confluent_kafka import KafkaException
from typer.core import TyperGroup

from onceflow.tools.errors import CliError, kafka_error_text
from onceflow.tools.output import error_line, note


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
