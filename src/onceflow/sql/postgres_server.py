"""A PostgreSQL server of the distribution's packages (Debian: `apt-get install postgresql`),
started on a free port in a temporary directory: for the onceflow-sql tests, and for
`onceflow verify --workload database --postgres`, whose `kill` fault SIGKILLs it.

initdb and postgres refuse to run as root: as root the server runs as the `postgres` user the
package creates (its directory is made in /tmp and handed to that user, since pytest's own
temporary directories are private to root). The server is its own process group, so `kill()`
takes the postmaster and its backends down at once, as a crash would.
"""

from __future__ import annotations

import itertools
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

START_TIMEOUT_S = 60.0
SEARCH = ("/usr/lib/postgresql/*/bin",)
USER = "onceflow"
_serial = itertools.count()


class PostgresError(RuntimeError):
    """The server could not be started."""


class MissingPostgres(PostgresError):
    """No PostgreSQL binaries (initdb, postgres) on this machine."""


def binaries() -> Path:
    for pattern in SEARCH:
        found = sorted(Path("/").glob(pattern.lstrip("/")), reverse=True)
        for directory in found:
            if (directory / "initdb").exists() and (directory / "postgres").exists():
                return directory
    initdb = shutil.which("initdb")
    if initdb and shutil.which("postgres"):
        return Path(initdb).resolve().parent
    raise MissingPostgres(
        "PostgreSQL's initdb and postgres are not installed (apt-get install postgresql)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="onceflow-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.process: subprocess.Popen | None = None
        self.owner = None
        if os.geteuid() == 0:
            self.owner = pwd.getpwnam("postgres")
            os.chown(self.root, self.owner.pw_uid, self.owner.pw_gid)
        self.log = self.root / "server.log"
        self._run([str(bin_dir / "initdb"), "-D", str(self.data), "-U", USER, "-A", "trust"])

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    def _as_owner(self) -> dict:
        if self.owner is None:
            return {}
        return {"user": self.owner.pw_uid, "group": self.owner.pw_gid, "extra_groups": []}

    def _run(self, argv: list[str]) -> None:
        subprocess.run(argv, check=True, capture_output=True, cwd=self.root, **self._as_owner())

    def start(self) -> PostgresServer:
        log = self.log.open("ab")
        self.process = subprocess.Popen(
            [
                str(self.bin_dir / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.root),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "shared_buffers=16MB",
                "-c",
                "max_connections=50",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            start_new_session=True,
            **self._as_owner(),
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._accepts():
            if time.monotonic() > deadline:
                self.kill()
                raise PostgresError(f"PostgreSQL on {self.port} does not start: {self._tail()}")
            time.sleep(0.1)
        return self

    def _accepts(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise PostgresError(f"PostgreSQL exited: {self._tail()}")
        import psycopg

        try:
            with psycopg.connect(
                f"host=127.0.0.1 port={self.port} user={USER} dbname=postgres", connect_timeout=2
            ):
                return True
        except psycopg.OperationalError:
            return False

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""

    def new_database(self, hint: str) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = "t_" + re.sub(r"[^a-z0-9]+", "_", hint.lower())[:40] + f"_{next(_serial)}"
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user={USER} dbname=postgres", autocommit=True
        ) as conn:
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{name}"

    def restart(self) -> None:
        """Start it again on the same port and data (after kill(): crash recovery first)."""
        self.start()

    def kill(self) -> None:
        """SIGKILL the postmaster and its backends (a crash: recovery replays the WAL)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
        self.process = None

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)
