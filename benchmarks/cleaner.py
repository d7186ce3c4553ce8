"""The log cleaner's throughput, and what it costs produce throughput while it runs, in one run.

    python benchmarks/cleaner.py [MB] [SECONDS]

Writes MB of keyed 1 KiB records (10,000 keys) to a topic under `cleanup.policy=delete`, then
measures acks=all produce throughput to another topic for SECONDS with nothing to clean, then
switches the first topic to `compact` (IncrementalAlterConfigs) and measures again for SECONDS
while the cleaner works. Prints the cleaner's MB/s (bytes of segments read per second of a
round, from its log line), both produce figures and their ratio.
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from onceflow.broker.embedded import EmbeddedBroker

VALUE = b"v" * 1024
KEYS = 10_000
COMPACT = {
    "cleanup.policy": "compact",
    "segment.bytes": str(8 << 20),
    "min.cleanable.dirty.ratio": "0.01",
}
_ROUND = re.compile(r"cleaned \S+ \[.*\): .* -> \d+ bytes in ([\d.]+)s \(([\d.]+) MB/s\)")


def produce_for(bootstrap: str, topic: str, seconds: float | None, total: int | None) -> float:
    """Produce keyed records until `seconds` pass or `total` bytes are acked; MB/s acked."""
    acked = 0

    def done(err: object, msg: object) -> None:
        nonlocal acked
        if err is None:
            acked += len(VALUE)

    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 262144}
    )
    start = time.monotonic()
    n = 0
    while True:
        elapsed = time.monotonic() - start
        if (seconds is not None and elapsed >= seconds) or (total is not None and acked >= total):
            break
        try:
            producer.produce(topic, key=b"%d" % (n % KEYS), value=VALUE, on_delivery=done)
            n += 1
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    elapsed = time.monotonic() - start
    producer.flush(60)
    return acked / 1e6 / elapsed


def main() -> None:
    megabytes = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
    with tempfile.TemporaryDirectory() as tmp:
        broker = EmbeddedBroker(
            Path(tmp) / "data", settings={"log.cleaner.backoff.ms": "100"}, log_level="INFO"
        )
        with broker:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            futures = admin.create_topics(
                [
                    NewTopic("cleaned", 1, 1, config={**COMPACT, "cleanup.policy": "delete"}),
                    NewTopic("load", 1, 1, config={"segment.bytes": str(64 << 20)}),
                ]
            )
            for future in futures.values():
                future.result(10)
            produce_for(broker.bootstrap, "cleaned", None, megabytes << 20)
            idle = produce_for(broker.bootstrap, "load", seconds, None)
            compact = [
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
                for key, value in COMPACT.items()
            ]
            resource = ConfigResource(
                ConfigResource.Type.TOPIC, "cleaned", incremental_configs=compact
            )
            admin.incremental_alter_configs([resource])[resource].result(10)
            busy = produce_for(broker.bootstrap, "load", seconds, None)
            deadline = time.monotonic() + 600
            found = None
            while found is None and time.monotonic() < deadline:
                found = next(
                    (m for line in list(broker.output) if (m := _ROUND.search(line))), None
                )
                time.sleep(0.2)
    if found is None:
        raise SystemExit("no cleaning round finished")
    clean_seconds, clean_mbs = float(found.group(1)), float(found.group(2))
    print(f"cleaned {megabytes} MB (1 KiB values, {KEYS} keys): {clean_mbs:.1f} MB/s")
    print(f"round took {clean_seconds:.1f} s; produce measured over {seconds:.1f} s")
    print(f"produce while idle:    {idle:.1f} MB/s")
    print(f"produce while cleaning: {busy:.1f} MB/s")
    print(f"ratio (cleaning/idle):  {busy / idle:.2f}")


if __name__ == "__main__":
    main()
