"""Other clients, served while an attack runs: each of their round trips is timed, the worst
one kept, so that a test can assert the issue's bound on what everyone else waits."""

from __future__ import annotations

import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tests.waiting import wait_for
from tests.wire import WireClient

ROUND_TRIP_TIMEOUT = 5.0  # a frozen broker shows as this, not as a test that hangs


@dataclass
class Victims:
    """Runs each action (one round trip of another client; it raises when not served) over and
    over on a thread, timing each, until stopped."""

    actions: dict[str, Callable[[], object]]
    worst: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    rounds: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Victims:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(len(self.actions) * ROUND_TRIP_TIMEOUT + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, action in self.actions.items():
                started = time.monotonic()
                try:
                    action()
                except Exception as e:  # a timeout or a closed connection: not served
                    self.failures.setdefault(name, repr(e))
                took = time.monotonic() - started
                self.worst[name] = max(self.worst.get(name, 0.0), took)
            self.rounds += 1

    def wait_rounds(self, rounds: int, timeout: float = 120.0) -> None:
        """Until `rounds` rounds are done, or at the first one not served (no point waiting)."""
        wait_for(lambda: self.rounds >= rounds or self.failures, timeout, self.report)

    def report(self) -> str:
        worst = ", ".join(f"{name} {took:.3f} s" for name, took in self.worst.items())
        return f"{self.rounds} rounds; worst round trips: {worst}; failures: {self.failures}"

    def assert_served_within(self, bound: float) -> None:
        assert not self.failures, self.report()
        assert max(self.worst.values()) <= bound, self.report()


def size_prefix(size: int) -> bytes:
    """What announces a Kafka frame of `size` bytes."""
    return struct.pack(">i", size)


class Trickler:
    """Connections that each send `first` (a frame's size prefix, a TLS record's header; empty
    for connections already inside a frame), then one byte every `interval` seconds (on a
    thread) until stopped: the slow loris of a Kafka listener."""

    def __init__(self, clients: Iterable[WireClient], first: bytes, interval: float = 0.5) -> None:
        self.clients = list(clients)
        self.closed: set[int] = set()  # indexes of the connections the broker closed
        self._stop = threading.Event()
        for client in self.clients:
            client.send_raw(first)
            client.sock.setblocking(False)  # a byte that does not fit is sent next time
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            for i, client in enumerate(self.clients):
                if i in self.closed:
                    continue
                try:
                    client.sock.send(b"\x00")
                except (BlockingIOError, ssl.SSLWantWriteError):
                    continue  # the broker is not reading this one (its buffers are full)
                except OSError:
                    self.closed.add(i)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for client in self.clients:
            client.close()


def trickle_while_served(victims: Victims, attackers: list[WireClient], first: bytes) -> None:
    """Attackers send `first` (a size prefix) and trickle on while the victims make ten rounds:
    legal frames, so none is refused; they are only not waited for."""
    victims.wait_rounds(2)
    attack = Trickler(attackers, first)
    try:
        victims.wait_rounds(victims.rounds + 10)
        assert not attack.closed
    finally:
        attack.stop()
