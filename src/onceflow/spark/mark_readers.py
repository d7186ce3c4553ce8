"""Consumers that read done-marks, kept per Python worker process and reused across tasks.

A mark is read once per write task; making a consumer each time costs connections to the
cluster and to the group coordinator. Reading committed offsets is side-effect free, so one
consumer per group can serve every task of that group a worker runs.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from confluent_kafka import Consumer

CAPACITY = 32
"""Consumers kept per process (one per task partition a worker writes, typically)."""

_Key = tuple[tuple[str, str], ...]

_lock = threading.Lock()
_readers: OrderedDict[_Key, Consumer] = OrderedDict()


def _key(config: dict[str, object]) -> _Key:
    return tuple(sorted((k, str(v)) for k, v in config.items()))


def mark_reader(config: dict[str, object]) -> Consumer:
    """A consumer with exactly this configuration, made on first use, least recent evicted."""
    key = _key(config)
    with _lock:
        reader = _readers.get(key)
        if reader is not None:
            _readers.move_to_end(key)
            return reader
        reader = Consumer(config)
        _readers[key] = reader
        evicted = _readers.popitem(last=False)[1] if len(_readers) > CAPACITY else None
    if evicted is not None:
        evicted.close()
    return reader


def discard(config: dict[str, object]) -> None:
    """Forget (and close) the consumer of this configuration, e.g. after it failed."""
    with _lock:
        reader = _readers.pop(_key(config), None)
    if reader is not None:
        reader.close()


def close_all() -> None:
    """Close every cached consumer (a process that is done writing, or tests between brokers)."""
    with _lock:
        readers = list(_readers.values())
        _readers.clear()
    for reader in readers:
        reader.close()
