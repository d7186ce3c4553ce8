"""Where onceflow's broker spends its time per Produce request: py-spy samples the broker while
`onceflow bench`'s producers write to it, and the samples are summed by function.

    python benchmarks/produce_profile.py [--records 1000000] [--value-size 100] \
        [--producers 2] [--no-fsync] [--rate 500] [--top 15]

Starts a broker (fsync on unless --no-fsync) in a temporary directory, creates a 6-partition
topic, starts `py-spy record --nonblocking -f raw` on the broker, runs the producers of
`onceflow bench` (acks=all, idempotent, linger.ms=5), then stops py-spy. Prints the broker's
CPU time per Produce request (utime + stime from /proc, requests from librdkafka's statistics)
and the functions with the most samples: "own" counts samples where the function itself ran
(the leaf), "total" samples where it was anywhere below the event loop's callback (or a pool
thread's job); both are shares of the busy samples of every thread (samples in epoll and of
pool threads waiting for a job are left out: py-spy --nonblocking counts them as busy). The
us/request column spreads the broker's CPU per request by these shares: a sample is wall
time of a thread, so an fsync's wait shows as time too. Needs py-spy (`pip install py-spy`).
"""

from __future__ import annotations

import argparse
import collections
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from onceflow.bench.producers import PRODUCER_SETTINGS, ProducerJob, run_producer_processes
from onceflow.bench.targets import cpu_seconds, onceflow_launcher
from onceflow.bench.topics import create_topic
from onceflow.tools.clients import connect_admin

FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^:()]*)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """`function (path/to/module.py:123)` as `module.py:function` (lines merged)."""
    match = FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    return f"{Path(match['file']).name}:{match['function']}"


# Waiting, not working: the event loop in epoll, a pool thread for its next job (py-spy
# --nonblocking cannot tell a blocked thread from a busy one).
WAITING = {"selectors.py:EpollSelector.select", "thread.py:_worker"}
# What a thread runs is below these frames: a callback of the event loop, a pool thread's job.
ANCHORS = {"events.py:Handle._run", "thread.py:_worker"}


def summarize(raw: str) -> tuple[int, int, collections.Counter[str], collections.Counter[str]]:
    """Busy samples, waiting samples, and per function of the busy ones: as the leaf (own),
    anywhere on the stack below the event loop's callback or the pool thread's job (total)."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = waiting = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        # py-spy's raw lines put the thread first, then the outermost frame ... the leaf.
        frames = [frame_name(f) for f in stack.split(";") if "(" in f]
        if not frames:
            continue
        if frames[-1] in WAITING:
            waiting += count
            continue
        samples += count
        own[frames[-1]] += count
        anchored = [i for i, name in enumerate(frames) if name in ANCHORS]
        work = frames[anchored[-1] + 1 :] if anchored else frames
        for name in set(work):
            total[name] += count
    return samples, waiting, own, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--no-fsync", action="store_true")
    parser.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="onceflow-profile-") as work:
        launch = onceflow_launcher(fsync=not args.no_fsync)
        broker, bootstrap = launch("onceflow", Path(work))
        try:
            broker.wait_ready()
            session = connect_admin(bootstrap)
            topic = f"onceflow-profile-{secrets.token_hex(4)}"
            create_topic(session, topic, 6, 1)
            share, extra = divmod(args.records, args.producers)
            jobs = [
                ProducerJob(bootstrap, topic, share + (i < extra), args.value_size,
                            PRODUCER_SETTINGS, True)
                for i in range(args.producers)
            ]  # fmt: skip
            raw_path = Path(work) / "profile.txt"
            spy = subprocess.Popen(
                [py_spy, "record", "--nonblocking", "-r", str(args.rate), "-f", "raw",
                 "-o", str(raw_path), "-p", str(broker.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(1.0)  # py-spy attaches before the first request arrives
            cpu_before = cpu_seconds(broker.pid)
            progress = Progress(console=console)
            with progress:
                task = progress.add_task("produce", total=args.records)
                reports = run_producer_processes(jobs, progress, task)
            cpu_after = cpu_seconds(broker.pid)
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spy.wait(60)
            del session
        finally:
            broker.stop()
        raw = raw_path.read_text()
    requests = sum(r.produce_requests for r in reports)
    seconds = max(r.finished for r in reports) - min(r.started for r in reports)
    assert cpu_before is not None and cpu_after is not None
    cpu = cpu_after - cpu_before
    samples, waiting, own, total = summarize(raw)
    kind = "--no-fsync" if args.no_fsync else "fsync on"
    print(
        f"broker {kind}: {args.records:,} x {args.value_size} B in {seconds:.1f} s "
        f"({args.records / seconds:,.0f} rec/s), {requests:,} Produce requests "
        f"({args.records / max(requests, 1):,.0f} records each), broker CPU {cpu:.2f} s = "
        f"{cpu * 1e6 / max(requests, 1):,.0f} us/request; {samples:,} busy samples, {waiting:,} "
        "waiting (epoll, idle pool threads: left out)"
    )
    us_per_sample = cpu * 1e6 / max(requests, 1) / max(samples, 1)
    for title, counter in (("own time (the leaf)", own), ("total time (on the stack)", total)):
        print(f"\nTop {args.top} by {title}; us/request = share x CPU per request\n")
        print("| function | own | total | ~us/request |")
        print("|---|---|---|---|")
        ranked = counter.most_common(args.top)
        for name, count in ranked:
            print(
                f"| `{name}` | {100 * own[name] / samples:.1f}% | "
                f"{100 * total[name] / samples:.1f}% | {count * us_per_sample:,.0f} |"
            )


if __name__ == "__main__":
    main()
