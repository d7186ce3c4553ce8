"""What the benchmarks need beyond onceflow's public modules: topics made with the AdminClient,
OffsetCommit requests pipelined on one connection, a committed offset asked over the wire,
certificates made for a run, and a throwaway PostgreSQL server.

The benchmarks are scripts (`python benchmarks/NAME.py`, which puts this folder on sys.path),
and they import no `tests.*` module: the test helpers may change with the tests, and a
benchmark must run from a checkout without the test suite on the path (tests/test_layers.py
checks it).
"""

from __future__ import annotations

import datetime
import io
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode
from kio.schema.offset_commit.v2.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_fetch.v7.request import OffsetFetchRequest, OffsetFetchRequestTopic
from kio.schema.types import GroupId, TopicName
from kio.serial import entity_writer
from kio.static.primitive import i32, i64, i64Timedelta

from onceflow.protocol.client import BrokerConnection, parse_address

# -- topics and offsets --------------------------------------------------------------------


def create_topic(bootstrap: str, name: str, partitions: int = 1, **configs: str) -> None:
    """Create one topic (replication 1) with `configs`; the creation must succeed."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    for future in admin.create_topics([NewTopic(name, partitions, 1, config=configs)]).values():
        future.result(timeout=30)


_BROKER_DEFAULT_RETENTION = i64Timedelta.parse(datetime.timedelta(milliseconds=-1))
PIPELINE_WINDOW = 256  # OffsetCommit requests in flight per connection


def offset_commit_request(group: str, topic: str, offsets: dict[int, int]) -> OffsetCommitRequest:
    """OffsetCommit v2 outside group management (generation -1), as `assign()` consumers
    commit."""
    partitions = tuple(
        OffsetCommitRequestPartition(
            partition_index=i32(p), committed_offset=i64(o), committed_metadata=""
        )
        for p, o in offsets.items()
    )
    return OffsetCommitRequest(
        group_id=GroupId(group),
        generation_id_or_member_epoch=i32(-1),
        member_id="",
        retention_time=_BROKER_DEFAULT_RETENTION,
        topics=(OffsetCommitRequestTopic(name=TopicName(topic), partitions=partitions),),
    )


def _frame(request: OffsetCommitRequest, correlation_id: int) -> bytes:
    header_cls = request.__header_schema__
    header = header_cls(
        request_api_key=request.__api_key__,
        request_api_version=request.__version__,
        correlation_id=correlation_id,
        client_id="commits",
    )
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header)
    entity_writer(type(request))(buf, request)
    return struct.pack(">i", buf.tell()) + buf.getvalue()


def _read_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        out += chunk
    return bytes(out)


def commit_many(bootstrap: str, group: str, commits: int, topic: str, partitions: int) -> None:
    """`commits` OffsetCommit requests of every partition (offsets 0, 1, ...), pipelined
    PIPELINE_WINDOW at a time on one connection. Responses are counted, not parsed: callers
    check the committed offsets."""
    host, port = parse_address(bootstrap)
    with socket.create_connection((host, port)) as sock:
        sent = received = 0
        while received < commits:
            batch = bytearray()
            while sent < commits and sent - received < PIPELINE_WINDOW:
                request = offset_commit_request(
                    group, topic, dict.fromkeys(range(partitions), sent)
                )
                batch += _frame(request, sent)
                sent += 1
            sock.sendall(batch)
            while received < sent and (sent == commits or sent - received >= PIPELINE_WINDOW // 2):
                size = struct.unpack(">i", _read_exact(sock, 4))[0]
                _read_exact(sock, size)
                received += 1


def commit_each(bootstrap: str, topic: str, groups: tuple[str, ...], commits: int) -> None:
    """`commits` OffsetCommit requests one at a time (partitions 0 and 1 at offset n), the
    groups taking turns; each must succeed."""
    host, port = parse_address(bootstrap)
    with BrokerConnection.connect(host, port, client_id="bench") as connection:
        for n in range(commits):
            request = offset_commit_request(groups[n % len(groups)], topic, {0: n, 1: n})
            response = connection.send(request)
            errors = {p.error_code for t in response.topics for p in t.partitions}
            if errors != {ErrorCode.none}:
                raise RuntimeError(f"OffsetCommit failed: {errors}")


class NotLoaded(RuntimeError):
    """OffsetFetch answered with a top-level error (the coordinator is still loading)."""


def fetch_committed_offset(bootstrap: str, group: str, tp: tuple[str, int]) -> tuple[int, int]:
    """OffsetFetch v7 for one partition: (partition error code, committed offset)."""
    request = OffsetFetchRequest(
        group_id=GroupId(group),
        topics=(OffsetFetchRequestTopic(name=TopicName(tp[0]), partition_indexes=(i32(tp[1]),)),),
        require_stable=False,
    )
    host, port = parse_address(bootstrap)
    with BrokerConnection.connect(host, port, client_id="bench") as connection:
        response = connection.send(request)
    if response.error_code != ErrorCode.none:
        raise NotLoaded(str(response.error_code))
    [partition] = response.topics[0].partitions
    return partition.error_code, partition.committed_offset


# -- TLS -----------------------------------------------------------------------------------

KEY_PASSWORD = "keystore-secret"


@dataclass(frozen=True)
class Certs:
    ca: Path  # clients' ssl.ca.location
    keystore: Path  # the broker's certificate chain and encrypted private key (PEM)


def make_certs(directory: Path) -> Certs:
    """A CA and a server certificate for 127.0.0.1/localhost (trustme), made for one run."""
    import trustme
    from cryptography.hazmat.primitives import serialization

    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="onceflow benchmarks")
    server = ca.issue_cert("127.0.0.1", "localhost")
    key = serialization.load_pem_private_key(server.private_key_pem.bytes(), password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(KEY_PASSWORD.encode()),
    )
    keystore = directory / "broker.pem"
    keystore.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems) + encrypted)
    ca_path = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    return Certs(ca=ca_path, keystore=keystore)


def broker_tls_settings(certs: Certs, client_auth: str = "none") -> dict[str, str]:
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certs.keystore),
        "ssl.key.password": KEY_PASSWORD,
        "ssl.truststore.location": str(certs.ca),
        "ssl.client.auth": client_auth,
    }


# -- PostgreSQL ----------------------------------------------------------------------------

PG_USER = "onceflow"


def postgres_binaries() -> Path:
    """The directory of the distribution's initdb and postgres (`apt-get install postgresql`)."""
    for directory in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (directory / "initdb").exists() and (directory / "postgres").exists():
            return directory
    initdb = shutil.which("initdb")
    if initdb and shutil.which("postgres"):
        return Path(initdb).resolve().parent
    raise SystemExit("PostgreSQL's initdb and postgres are not installed; or pass --url")


class PostgresServer:
    """A PostgreSQL server on a free port in a temporary directory (as root, run as the
    `postgres` user the package creates, since initdb refuses root); `close()` ends it."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="onceflow-pg-"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.process: subprocess.Popen[bytes] | None = None
        self.owner = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        if self.owner is not None:
            os.chown(self.root, self.owner.pw_uid, self.owner.pw_gid)
        subprocess.run(
            [str(bin_dir / "initdb"), "-D", str(self.root / "data"), "-U", PG_USER, "-A", "trust"],
            check=True, capture_output=True, cwd=self.root, **self._as_owner(),
        )  # fmt: skip

    def _as_owner(self) -> dict[str, object]:
        if self.owner is None:
            return {}
        return {"user": self.owner.pw_uid, "group": self.owner.pw_gid, "extra_groups": []}

    def start(self) -> PostgresServer:
        import psycopg

        self.process = subprocess.Popen(
            [str(self.bin_dir / "postgres"), "-D", str(self.root / "data"), "-p", str(self.port),
             "-k", str(self.root), "-c", "listen_addresses=127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.root,
            start_new_session=True, **self._as_owner(),
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise RuntimeError("PostgreSQL exited while starting")
            try:
                with psycopg.connect(self._dsn("postgres"), connect_timeout=2):
                    return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={PG_USER} dbname={database}"

    def new_database(self, name: str) -> str:
        """A new empty database; its URL."""
        import psycopg

        with psycopg.connect(self._dsn("postgres"), autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)
        shutil.rmtree(self.root, ignore_errors=True)
