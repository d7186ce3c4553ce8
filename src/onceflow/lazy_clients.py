"""Kafka clients held by objects that Spark pickles (a source's reader, the mirror's helpers).

A librdkafka client is a process's resource (its threads and sockets), so such an object makes
its clients on first use, in the process that uses them, and a pickled copy carries none:
declare each as a :class:`client_property` of a :class:`HoldsClients`.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, TypeVar

_C = TypeVar("_C")


class client_property(cached_property[_C]):
    """A client made on first use and kept; dropped when its holder is pickled."""


class HoldsClients:
    """Holds clients in :class:`client_property` attributes: pickles without them, and
    :meth:`close_clients` closes the ones made (the next use makes new ones)."""

    def _made_clients(self) -> list[str]:
        cls = type(self)
        return [n for n in self.__dict__ if isinstance(getattr(cls, n, None), client_property)]

    def __getstate__(self) -> dict[str, Any]:
        made = set(self._made_clients())
        return {name: value for name, value in self.__dict__.items() if name not in made}

    def close_clients(self) -> None:
        for name in self._made_clients():
            close = getattr(self.__dict__.pop(name), "close", None)
            if close is not None:
                close()
