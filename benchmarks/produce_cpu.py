"""The broker's CPU time per Produce request, for brokers compared in one run.

Throughput on a shared 2-core machine says as much about the machine's load as about the
broker; the CPU seconds a broker spends (utime + stime of its process, from /proc) on the same
requests say what its code costs. Each target gets the same pre-built requests: idempotent
batches of `--records` records of `--value-size` bytes to every partition of a topic, acks=all,
`--in-flight` requests pipelined on one connection as librdkafka does. Rounds alternate between
the targets; the median is shown, with the ratio to the first target.

    python benchmarks/produce_cpu.py before=127.0.0.1:39401 after=127.0.0.1:39402 \
        [--requests 4000] [--records 50] [--partitions 6] [--value-size 100] [--rounds 5]

Targets are started by hand (`onceflow broker --data-dir D --listen HOST:PORT`), each given as
NAME=HOST:PORT=PID or NAME=HOST:PORT (the PID is then found from the listening port).
"""

from __future__ import annotations

import argparse
import datetime
import socket
import statistics
import subprocess
import time
import uuid
from collections import deque
from pathlib import Path

from kio.schema.create_topics.v5.request import CreatableTopic, CreateTopicsRequest
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from onceflow.protocol.client import BrokerConnection, _frame
from onceflow.records.builder import build_batch


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime, stime in clock ticks


def pid_listening(port: int) -> int:
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True)
    return int(out.stdout.split("pid=", 1)[1].split(",", 1)[0])


def prepare(host: str, port: int, args: argparse.Namespace) -> tuple[str, list[bytes]]:
    """Create a topic and pre-build the framed Produce requests of one round."""
    topic = f"cpu-{uuid.uuid4().hex[:8]}"
    with BrokerConnection.connect(host, port) as conn:
        conn.send(
            CreateTopicsRequest(
                topics=(
                    CreatableTopic(
                        name=topic,
                        num_partitions=args.partitions,
                        replication_factor=1,
                        assignments=(),
                        configs=(),
                    ),
                ),
                timeout=datetime.timedelta(seconds=30),
                validate_only=False,
            )
        )
        ids = conn.send(
            InitProducerIdRequest(
                transactional_id=None,
                transaction_timeout=datetime.timedelta(seconds=60),
                producer_id=-1,
                producer_epoch=-1,
            )
        )
    value = b"v" * args.value_size
    now = int(time.time() * 1000)
    records = [(f"k{i}".encode(), value, (), now) for i in range(args.records)]
    frames = []
    for n in range(args.requests):
        parts = tuple(
            PartitionProduceData(
                index=p,
                records=build_batch(
                    records,
                    producer_id=int(ids.producer_id),
                    producer_epoch=int(ids.producer_epoch),
                    base_sequence=n * args.records,
                ),
            )
            for p in range(args.partitions)
        )
        request = ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout=datetime.timedelta(seconds=30),
            topic_data=(TopicProduceData(name=topic, partition_data=parts),),
        )
        frames.append(_frame(request, n, "produce-cpu"))
    return topic, frames


def run(host: str, port: int, frames: list[bytes], in_flight: int) -> None:
    """Send every request, at most `in_flight` unanswered, and read every answer."""
    with socket.create_connection((host, port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pending: deque[int] = deque()
        buf = bytearray()
        sent = 0
        while sent < len(frames) or pending:
            while sent < len(frames) and len(pending) < in_flight:
                sock.sendall(frames[sent])
                pending.append(sent)
                sent += 1
            while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
                chunk = sock.recv(1 << 16)
                if not chunk:
                    raise ConnectionError("the broker closed the connection")
                buf += chunk
            size = int.from_bytes(buf[:4], "big")
            del buf[: 4 + size]
            pending.popleft()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="+", help="NAME=HOST:PORT[=PID]")
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--records", type=int, default=50, help="records per batch")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--in-flight", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    targets = []
    for spec in args.targets:
        name, address, *pid = spec.split("=")
        host, port = address.rsplit(":", 1)
        targets.append((name, host, int(port), int(pid[0]) if pid else pid_listening(int(port))))
    results: dict[str, list[float]] = {name: [] for name, *_ in targets}
    for round_no in range(args.rounds):
        for name, host, port, pid in targets:
            _, frames = prepare(host, port, args)
            before, wall = cpu_seconds(pid), time.perf_counter()
            run(host, port, frames, args.in_flight)
            cpu, wall = cpu_seconds(pid) - before, time.perf_counter() - wall
            results[name].append(cpu / args.requests * 1e6)
            print(f"round {round_no + 1} {name}: {cpu:.2f} s CPU, {wall:.2f} s wall", flush=True)
    base = statistics.median(results[targets[0][0]])
    batches = args.requests * args.partitions
    print(
        f"\n{args.requests} requests x {args.partitions} batches x {args.records} records "
        f"of {args.value_size} B, median of {args.rounds} rounds:"
    )
    for name, values in results.items():
        median = statistics.median(values)
        per_record = median * args.requests / (batches * args.records) * 1000
        print(
            f"{name:>10}: {median:7.1f} us CPU/request  {per_record:6.1f} ns/record  "
            f"{median / base:.2f}x of {targets[0][0]}"
        )


if __name__ == "__main__":
    main()
