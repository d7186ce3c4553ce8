"""Connection limits as Kafka's ConnectionQuotas applies them.

`max.connections.per.ip` (and its overrides): a new connection over its address's limit is
closed at once. `max.connections`: when the broker is full the acceptor waits for a slot
(KIP-402), so the new connection stays in the listen backlog until another one closes.
"""

from __future__ import annotations

import asyncio

from onceflow.broker.config import ConfigError


def parse_overrides(text: str) -> dict[str, int]:
    """`max.connections.per.ip.overrides`: "host:count,host:count" (IPv6 hosts end at the last
    colon)."""
    out: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        host, sep, count = item.rpartition(":")
        if not sep or not host or not count.strip().isdigit():
            raise ConfigError(f"max.connections.per.ip.overrides: {item!r} is not host:count")
        out[host.strip().strip("[]")] = int(count)
    return out


class ConnectionQuotas:
    def __init__(self, max_connections: int, max_per_ip: int, overrides: str = "") -> None:
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self.overrides = parse_overrides(overrides)
        self.total = 0
        self._per_ip: dict[str, int] = {}
        self._slot_freed = asyncio.Event()
        # Connections refused or made to wait, by the limit's name (the metrics read them).
        self.refused: dict[str, int] = {"max.connections.per.ip": 0, "max.connections": 0}

    def refuse(self, limit: str) -> None:
        """Count a connection closed (or made to wait) by `limit`, a setting's name."""
        self.refused[limit] = self.refused.get(limit, 0) + 1

    def limit_for(self, host: str) -> int:
        return self.overrides.get(host, self.max_per_ip)

    def count(self, host: str) -> int:
        return self._per_ip.get(host, 0)

    async def wait_for_slot(self) -> None:
        """Return once a connection may be accepted under `max.connections`."""
        while not self.slot_available():
            self.refused["max.connections"] += 1
            self._slot_freed.clear()
            await self._slot_freed.wait()

    def slot_available(self, pending: int = 0) -> bool:
        """Whether one more connection fits, with `pending` accepted but not yet counted."""
        return self.total + pending < self.max_connections

    def admit(self, host: str) -> bool:
        """Count a new connection from `host`, or refuse it (False) over its per-IP limit."""
        count = self._per_ip.get(host, 0)
        if count >= self.limit_for(host):
            self.refused["max.connections.per.ip"] += 1
            return False
        self._per_ip[host] = count + 1
        self.total += 1
        return True

    def release(self, host: str) -> None:
        count = self._per_ip.get(host, 0) - 1
        if count > 0:
            self._per_ip[host] = count
        else:
            self._per_ip.pop(host, None)
        self.total -= 1
        self._slot_freed.set()
