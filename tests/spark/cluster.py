"""A Spark standalone cluster started from the pyspark package itself (a master and two
workers of one core each, through `spark-class`), onceflow shipped to it as users ship it
(`--py-files onceflow.zip`), and `spark-submit` of the bundled pipelines against it.

The executors and the driver run a Python that has onceflow's dependencies but not onceflow
(`executor_python`), and no PYTHONPATH from the tests: the only onceflow they can import is
the shipped one. The driver gets it on PYTHONPATH: Spark (4.x) hands `--py-files` to the
driver's Python process but not to the Python process that plans a streaming Python data
source on the driver (PythonStreamingSourceRunner looks for them in a `streaming_job`
folder of SparkFiles that nothing fills), so the driver's machine needs onceflow importable
(installed, or PYTHONPATH), as it needs the pipeline script anyway.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from tests.process_group import kill_process_group
from tests.waiting import wait_for

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
SPARK_SUBMIT = SPARK_HOME / "bin" / "spark-submit"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def onceflow_zip(src: Path, target: Path) -> Path:
    """src/onceflow as a zip for `--py-files`: the Python modules only (the C record walker is
    the broker's; zipimport cannot load it and no pipeline needs it)."""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted((src / "onceflow").rglob("*.py")):
            if "__pycache__" not in path.parts:
                archive.write(path, path.relative_to(src))
    return target


def executor_python(directory: Path) -> Path:
    """A Python environment that sees this venv's packages (pyspark, confluent-kafka, pyarrow)
    but not onceflow, which the venv has as an editable install (a .pth file this environment
    does not process): what a cluster node with the dependencies installed looks like."""
    subprocess.run(
        [sys._base_executable, "-m", "venv", "--without-pip", str(directory)],  # type: ignore[attr-defined]
        check=True,
        timeout=120,
    )
    python = directory / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    (Path(purelib) / "venv-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def clean_env(python: Path, **extra: str) -> dict[str, str]:
    """The environment of every cluster process: no PYTHONPATH, the executor Python."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP=HOST,
        PYSPARK_PYTHON=str(python),
        PYSPARK_DRIVER_PYTHON=str(python),
        **extra,
    )
    return env


class ClusterStartError(RuntimeError):
    """The master or a worker exited, or the workers did not register in time."""


@dataclass
class StandaloneCluster:
    """A master and `workers` workers (1 core, 1 GB each), each in its own process group."""

    directory: Path
    python: Path
    workers: int = 2
    port: int = field(default_factory=free_port)
    webui_port: int = field(default_factory=free_port)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.directory / f"{name}.log").open("wb")
        process = subprocess.Popen(
            [str(SPARK_CLASS), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean_env(self.python, SPARK_WORKER_DIR=str(self.directory / name)),
            start_new_session=True,  # its own process group: the executors it starts included
        )
        self.processes.append(process)
        return process

    def state(self) -> dict:
        url = f"http://{HOST}:{self.webui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.load(answer)

    def alive_workers(self) -> int:
        for process in self.processes:
            if process.poll() is not None:
                raise ClusterStartError(f"{process.args} exited with {process.returncode}")
        try:
            return sum(1 for w in self.state()["workers"] if w["state"] == "ALIVE")
        except (OSError, urllib.error.URLError, ValueError):
            return 0  # the master's UI is not up yet

    def start(self, timeout: float = 180) -> StandaloneCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._spawn(
            "master", "org.apache.spark.deploy.master.Master",
            "--host", HOST, "--port", str(self.port), "--webui-port", str(self.webui_port),
        )  # fmt: skip
        for i in range(self.workers):
            self._spawn(
                f"worker-{i}", "org.apache.spark.deploy.worker.Worker", self.master_url,
                "--host", HOST, "--cores", "1", "--memory", "1g", "--webui-port", "0",
                "--work-dir", str(self.directory / f"worker-{i}"),
            )  # fmt: skip
        wait_for(
            lambda: self.alive_workers() == self.workers,
            timeout,
            lambda: f"{self.workers} workers registered; logs in {self.directory}",
            interval=0.5,
        )
        return self

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)

    def executor_pids(self) -> list[int]:
        """The executor JVMs the workers run now (children of a worker)."""
        worker_pids = {p.pid for p in self.processes[1:]}
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # exited meanwhile
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if parent in worker_pids and EXECUTOR_CLASS.encode() in cmdline:
                found.append(int(entry.name))
        return found


def submit(
    cluster: StandaloneCluster, py_files: Path | str, script: Path, *args: str, log: Path
) -> subprocess.Popen[bytes]:
    """`spark-submit` of a pipeline script to the cluster, 2 executors of one core each;
    onceflow for the executors only from `--py-files` (a comma-separated list: onceflow.zip
    first), for the driver from PYTHONPATH."""
    command = [
        str(SPARK_SUBMIT),
        "--master", cluster.master_url,
        "--total-executor-cores", "2",
        "--executor-cores", "1",
        "--executor-memory", "512m",
        "--py-files", str(py_files),
        "--conf", f"spark.driver.host={HOST}",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.shuffle.partitions=2",
        str(script), *args,
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=clean_env(cluster.python, PYTHONPATH=str(py_files).split(",")[0]),
        cwd=log.parent,
        start_new_session=True,  # its own process group: its driver JVM and Python workers
    )


@contextmanager
def submitted(
    cluster: StandaloneCluster, py_files: Path | str, script: Path, *args: str, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """submit(), and the job's process group killed on the way out if it is still running."""
    job = submit(cluster, py_files, script, *args, log=log)
    try:
        yield job
    finally:
        kill_process_group(job)


def wait_success(job: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """The job must exit 0 within `timeout` seconds; else fail with the end of its log."""
    try:
        code = job.wait(timeout)
    except subprocess.TimeoutExpired:
        code = None
    assert code == 0, f"spark-submit: exit code {code}:\n{log.read_text()[-4000:]}"
