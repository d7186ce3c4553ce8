"""Crash and delay points for fault tests.

`ONCEFLOW_CRASH_AT=name[:n]` in the broker's environment makes it SIGKILL itself the n-th time
(default 1st) it reaches the named point, so a test can crash it at an exact step of a protocol
(between a transaction's decision and its markers, after part of its markers, after an append
that is durable but not yet acknowledged). `ONCEFLOW_DELAY_AT=name:ms[:n]` holds the broker's
work at a delay point that long, the first n times (default every time), so a test can look at
the state in between (a decided transaction whose markers are not written yet) or make a
client time out once. `ONCEFLOW_RAISE_AT=name[:n]` makes the n-th
(default 1st) pass through a raise point raise InjectedFaultError once, so a test can show that
a background task survives an exception, or what a failure half-way leaves. Unset, each costs
one comparison.
"""

from __future__ import annotations

import asyncio
import errno
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
        "cleaner.after-cleaned",  # a cleaned segment's .cleaned files written and synced
        "cleaner.after-swap-rename",  # renamed to .swap (the commit point), old files intact
        "cleaner.after-deleted-rename",  # the replaced segments' files renamed to .deleted
        "cleaner.after-swap-complete",  # .swap renamed to the live names, .deleted not removed
        "cleaner.before-checkpoint",  # a round's segments swapped, its checkpoint not written
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


DELAY_POINTS = frozenset(
    {
        "txn.before-markers",  # decided (Prepare* durable), no marker yet
        "commit.before-round",  # a log's group-commit flush has its writers, not yet prepared
        "produce.before-response",  # appended and durable, the producer not yet answered
        "produce.after-add",  # a version 2 Produce's partitions added, its records not appended
        "cleaner.before-swap",  # a cleaned segment's files written, not yet swapped in
    }
)

_delay_name, _, _delay_spec = os.environ.get("ONCEFLOW_DELAY_AT", "").partition(":")
_delay_ms, _, _delay_count = _delay_spec.partition(":")
_delays_left = int(_delay_count) if _delay_count else None  # None: every time
if _delay_name and _delay_name not in DELAY_POINTS:
    raise ValueError(f"ONCEFLOW_DELAY_AT names unknown delay point {_delay_name!r}")


async def delay_point(name: str) -> None:
    global _delays_left
    if name != _delay_name or _delays_left == 0:
        return
    if _delays_left is not None:
        _delays_left -= 1
    await asyncio.sleep(int(_delay_ms or 0) / 1000)


RAISE_POINTS = frozenset(
    {
        "loop.retention",  # one retention check (log.retention.check.interval.ms)
        "loop.log-cleaner",  # one log cleaner round (log.cleaner.backoff.ms)
        "loop.group-timer",  # one tick of the group coordinator's timers (session expiry)
        "loop.transaction-timeout",  # one check for timed-out transactions
        "commit.prepare",  # preparing one log's group-commit flush
        "txn.markers",  # writing one decided transaction's markers
        "topics.open-partition",  # before each partition a topic change creates
    }
)


class InjectedFaultError(OSError):
    """Raised at a raise point; an OSError that is not a storage failure (EMFILE), as a
    descriptor shortage would be."""

    def __init__(self, point: str) -> None:
        super().__init__(errno.EMFILE, f"fault injected at {point}")


_raise_name, _, _raise_count = os.environ.get("ONCEFLOW_RAISE_AT", "").partition(":")
_raise_remaining = int(_raise_count or 1)
if _raise_name and _raise_name not in RAISE_POINTS:
    raise ValueError(f"ONCEFLOW_RAISE_AT names unknown raise point {_raise_name!r}")


def raise_point(name: str) -> None:
    global _raise_remaining
    if name != _raise_name or _raise_remaining <= 0:
        return
    _raise_remaining -= 1
    if _raise_remaining == 0:
        raise InjectedFaultError(name)
