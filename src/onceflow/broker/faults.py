"""Crash points for fault tests.

`ONCEFLOW_CRASH_AT=name[:n]` in the broker's environment makes it SIGKILL itself the n-th time
(default 1st) it reaches the named point, so a test can crash it at an exact step of a protocol
(between a transaction's decision and its markers, after part of its markers, after an append
that is durable but not yet acknowledged). Unset, a crash point costs one comparison.
"""

from __future__ import annotations

import os
import signal

POINTS = frozenset(
    {
        "produce.before-response",  # appended and durable, the producer not yet answered
        "txn.after-decision",  # PrepareCommit/PrepareAbort durable, no marker written yet
        "txn.after-marker",  # one more marker appended (n counts them)
        "txn.before-complete",  # every marker durable, Complete* not yet written
    }
)

_spec = os.environ.get("ONCEFLOW_CRASH_AT", "")
_name, _, _count = _spec.partition(":")
_remaining = int(_count or 1)
if _name and _name not in POINTS:
    raise ValueError(f"ONCEFLOW_CRASH_AT names unknown crash point {_name!r}")


def crash_point(name: str) -> None:
    global _remaining
    if name != _name:
        return
    _remaining -= 1
    if _remaining <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
