"""How long a broker takes to accept and answer N connections that arrive at once.

    python benchmarks/accept_burst.py [N] [-o key=value ...]

Opens N non-blocking connections together, sends one ApiVersions v0 on each as soon as it is
connected, and reports the time until every one is answered (and the slowest connect).
"""

from __future__ import annotations

import selectors
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

from onceflow.broker.embedded import EmbeddedBroker

API_VERSIONS_V0 = struct.pack(">ihhih", 12, 18, 0, 1, 2) + b"ab"


def burst(port: int, n: int) -> tuple[float, float]:
    sel = selectors.DefaultSelector()
    start = time.monotonic()
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        sel.register(s, selectors.EVENT_WRITE, "connect")
        socks.append(s)
    connected_at = 0.0
    answered = 0
    while answered < n:
        if time.monotonic() - start > 120:
            raise TimeoutError(f"only {answered} of {n} answered")
        for key, _ in sel.select(1.0):
            s = key.fileobj
            if key.data == "connect":
                s.send(API_VERSIONS_V0)
                connected_at = max(connected_at, time.monotonic() - start)
                sel.modify(s, selectors.EVENT_READ, "answer")
            else:
                if s.recv(65536):
                    answered += 1
                sel.unregister(s)
    elapsed = time.monotonic() - start
    for s in socks:
        s.close()
    return connected_at, elapsed


def main() -> None:
    args = sys.argv[1:]
    n = int(args.pop(0)) if args and args[0].isdigit() else 1000
    settings = dict(a.split("=", 1) for a in args[1::2]) if args else {}
    with tempfile.TemporaryDirectory() as tmp:
        broker = EmbeddedBroker(Path(tmp), settings=settings).start()
        try:
            for run in range(3):
                connected, elapsed = burst(broker.port, n)
                print(
                    f"run {run}: {n} connections: last connected {connected:.2f}s, "
                    f"all answered {elapsed:.2f}s ({n / elapsed:.0f}/s)"
                )
                time.sleep(1)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
