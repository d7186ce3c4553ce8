"""The produce benchmark with the metrics endpoint on and off, in one run.

Starts two onceflow brokers alike but for `metrics.listen` (the one with it is scraped every
`--scrape-interval` seconds, harsher than Prometheus's default 15 s), then runs `onceflow
bench` against both: its rounds interleave the targets, and it prints each figure's ratio to
the broker without metrics (the baseline). Throughput on this shared machine swings by 2x
from round to round, so the script also prints what the endpoint costs the broker itself:
each broker's CPU seconds (utime + stime from /proc) over the whole run, the same workload
for both, and the median of the rounds' paired produce ratios (on/off, same round).

    python benchmarks/metrics_overhead.py [--records 300000] [--rounds 5] [--no-fsync]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

from onceflow.broker.embedded import EmbeddedBroker


def scrape_until(port: int, interval: float, stop: threading.Event, count: list[int]) -> None:
    while not stop.wait(interval):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            answer.read()
        count[0] += 1


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def paired_ratios(path: Path) -> list[float]:
    """Per round, metrics-on's produce records/s over metrics-off's (the rounds interleave)."""
    results = {r["target"]: r for r in json.loads(path.read_text())["results"]}
    on = [r["records_per_s"] for r in results["metrics-on"]["produce_rounds"]]
    off = [r["records_per_s"] for r in results["metrics-off"]["produce_rounds"]]
    return [a / b for a, b in zip(on, off, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    parser.add_argument("--no-fsync", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fsync = not args.no_fsync
        on = EmbeddedBroker(
            Path(tmp) / "on", fsync=fsync, settings={"metrics.listen": "127.0.0.1:0"}
        )
        off = EmbeddedBroker(Path(tmp) / "off", fsync=fsync)
        stop = threading.Event()
        scrapes = [0]
        try:
            on.start()
            off.start()
            assert on.metrics_port is not None
            scraper = threading.Thread(
                target=scrape_until,
                args=(on.metrics_port, args.scrape_interval, stop, scrapes),
                daemon=True,
            )
            scraper.start()
            command = [
                sys.executable,
                "-c",
                "from onceflow.cli.main import app; app()",
                "bench",
                "-b",
                f"metrics-off={off.bootstrap}",
                "-b",
                f"metrics-on={on.bootstrap}",
                "--baseline",
                "metrics-off",
                "--value-size",
                str(args.value_size),
                "--records",
                str(args.records),
                "--rounds",
                str(args.rounds),
                "--producers",
                str(args.producers),
            ]
            report = args.json or Path(tmp) / "bench.json"
            command += ["--json", str(report)]
            cpu_before = {"on": cpu_seconds(on.pid), "off": cpu_seconds(off.pid)}
            subprocess.run(command, check=True)
            cpu = {
                name: cpu_seconds(b.pid) - cpu_before[name]
                for name, b in (("on", on), ("off", off))
            }
            ratios = paired_ratios(report)
        finally:
            stop.set()
            on.stop()
            off.stop()
        print(f"metrics-on was scraped {scrapes[0]} times (every {args.scrape_interval} s)")
        print(
            f"broker CPU over the run: metrics-on {cpu['on']:.2f} s, metrics-off "
            f"{cpu['off']:.2f} s, on/off {cpu['on'] / cpu['off']:.3f}"
        )
        print(
            "produce records/s on/off, paired by round: "
            + ", ".join(f"{r:.3f}" for r in ratios)
            + f"; median {statistics.median(ratios):.3f}"
        )


if __name__ == "__main__":
    main()
