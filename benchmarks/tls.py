"""Produce throughput over TLS (SSL, SASL_SSL) as a ratio to PLAINTEXT, in one run.

    python benchmarks/tls.py [--records N] [--size BYTES] [--rounds R] [--fsync]

One broker with a PLAINTEXT, an SSL and a SASL_SSL (SCRAM-SHA-256) listener, certificates made
for the run (trustme); one confluent-kafka producer (acks=all, idempotent) per listener and
round, the listeners interleaved round by round; the median records/s of the rounds and its
ratio to PLAINTEXT are printed. fsync is off by default so that the figure is TLS's cost, not
the disk's (--fsync to measure with it). A benchmark: it prints figures, it never fails.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _support import broker_tls_settings, make_certs
from confluent_kafka import Producer

from onceflow.broker.embedded import EmbeddedBroker

LISTENERS = "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0"
PASSWORD = "bench-password"


def produce(config: dict[str, object], records: int, value: bytes) -> float:
    """Records/s of one producer sending `records` values and waiting for every ack."""
    producer = Producer({**config, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    topic = f"tls-bench-{uuid.uuid4().hex[:8]}"
    producer.produce(topic, b"warm-up")  # topic creation and the handshake, not measured
    producer.flush(30)
    start = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, value)
                break
            except BufferError:
                producer.poll(0.01)
    left = producer.flush(120)
    elapsed = time.perf_counter() - start
    if left:
        raise RuntimeError(f"{left} records not acknowledged")
    return records / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fsync", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        certs = make_certs(Path(tmp) / "certs")
        data_dir = Path(tmp) / "data"
        subprocess.run(
            [sys.executable, "-m", "onceflow.cli.main", "users", "set", "bench",
             "--password-file", "-", "--data-dir", str(data_dir)],
            input=PASSWORD + "\n", text=True, check=True, capture_output=True,
        )  # fmt: skip
        broker = EmbeddedBroker(
            data_dir,
            listeners=LISTENERS,
            fsync=args.fsync,
            settings={**broker_tls_settings(certs, "none")},
        ).start()
        try:
            configs = {
                "PLAINTEXT": {},
                "SSL": {"ssl.ca.location": str(certs.ca)},
                "SASL_SSL": {
                    "ssl.ca.location": str(certs.ca),
                    "sasl.mechanism": "SCRAM-SHA-256",
                    "sasl.username": "bench",
                    "sasl.password": PASSWORD,
                },
            }
            rates: dict[str, list[float]] = {name: [] for name in configs}
            value = b"x" * args.size
            for _ in range(args.rounds):
                for name, extra in configs.items():
                    config = {
                        "bootstrap.servers": broker.bootstrap_for(name),
                        "security.protocol": name,
                        **extra,
                    }
                    rates[name].append(produce(config, args.records, value))
        finally:
            broker.stop()
    base = statistics.median(rates["PLAINTEXT"])
    print(
        f"produce, {args.records} x {args.size} B, acks=all, fsync "
        f"{'on' if args.fsync else 'off'}, median of {args.rounds} rounds:"
    )
    for name, values in rates.items():
        median = statistics.median(values)
        mb = median * args.size / 1e6
        print(f"  {name:<10} {median:>10,.0f} records/s  {mb:7.1f} MB/s  x{median / base:.2f}")


if __name__ == "__main__":
    main()
