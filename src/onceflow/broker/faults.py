"""Crash and delay points for fault tests.

`ONCEFLOW_CRASH_AT=name[:n]` in the broker's environment makes it SIGKILL itself the n-th time
(default 1st) it reaches the named point, so a test can crash it at an exact step of a protocol
(between a transaction's decision and its markers, after part of its markers, after an append
that is durable but not yet acknowledged). `ONCEFLOW_DELAY_AT=name:ms` holds the broker's work
at a delay point that long each time, so a test can look at the state in between (a decided
transaction whose markers are not written yet). `ONCEFLOW_FAIL_AT=name[:n]` makes the n-th pass
(default 1st) through a fail point raise an OSError, as a full disk or a descriptor limit would,
so a test can check what a failure half-way leaves. Unset, each costs one comparison.
"""

from __future__ import annotations

import asyncio
import os
import signal

POINTS = frozenset(
    {
        "produce.before-response",  # appended and durable, the producer not yet answered
        "txn.after-decision",  # PrepareCommit/PrepareAbort durable, no marker written yet
        "txn.after-marker",  # one more marker appended (n counts them)
        "txn.before-complete",  # every marker durable, Complete* not yet written
        "topics.before-record",  # a CreateTopics' directories made, topics.json not yet written
        "topics.after-delete-rename",  # deleted topics' directories renamed, not yet removed
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


DELAY_POINTS = frozenset({"txn.before-markers"})  # decided (Prepare* durable), no marker yet

_delay_name, _, _delay_ms = os.environ.get("ONCEFLOW_DELAY_AT", "").partition(":")
if _delay_name and _delay_name not in DELAY_POINTS:
    raise ValueError(f"ONCEFLOW_DELAY_AT names unknown delay point {_delay_name!r}")


async def delay_point(name: str) -> None:
    if name == _delay_name:
        await asyncio.sleep(int(_delay_ms or 0) / 1000)


FAIL_POINTS = frozenset({"topics.open-partition"})  # before each partition a request creates


class InjectedFaultError(OSError):
    """Raised at a fail point: stands for a disk or descriptor error there."""


_fail_name, _, _fail_count = os.environ.get("ONCEFLOW_FAIL_AT", "").partition(":")
_fail_remaining = int(_fail_count or 1)
if _fail_name and _fail_name not in FAIL_POINTS:
    raise ValueError(f"ONCEFLOW_FAIL_AT names unknown fail point {_fail_name!r}")


def fail_point(name: str) -> None:
    global _fail_remaining
    if name != _fail_name:
        return
    _fail_remaining -= 1
    if _fail_remaining == 0:
        raise InjectedFaultError(f"injected failure at {name}")
