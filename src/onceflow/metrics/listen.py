"""`metrics.listen`: where the scrape endpoint listens."""

from __future__ import annotations


class MetricsListenError(ValueError):
    """`metrics.listen` is not HOST:PORT."""


def parse_listen(value: str) -> tuple[str, int] | None:
    """`metrics.listen` as (host, port); None when empty (the endpoint is off)."""
    value = value.strip()
    if not value:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise MetricsListenError(f"metrics.listen={value!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)
