"""How a benchmark fails: a typed error, and when a phase without progress has stalled."""

from __future__ import annotations

from onceflow.tools.errors import CliError

# A phase with no progress for this long has stalled: the target is reported as failed.
STALL_TIMEOUT_S = 60.0


class BenchError(CliError):
    """A target could not be measured."""
