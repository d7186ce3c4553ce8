"""The Grafana dashboard works: a real Prometheus (Debian's `prometheus` package) scrapes a
broker under load, and every query of every panel returns data through its HTTP API.

Without the binary the test is skipped, naming it; under CI (CI=true) it fails instead."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from onceflow.broker.embedded import EmbeddedBroker
from tests.waiting import wait_for

DASHBOARD = Path(__file__).resolve().parents[2] / "grafana" / "onceflow-broker.json"


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def _prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        message = "the prometheus binary is not installed (apt-get install -y prometheus)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Any]:
    """Start Prometheus scraping the given metrics port every second; its API's address."""
    binary = _prometheus_binary()
    started: list[subprocess.Popen[bytes]] = []

    def start(metrics_port: int) -> str:
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: onceflow\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{metrics_port}']\n"
        )
        address = f"127.0.0.1:{_free_port()}"
        log = (tmp_path / "prometheus.log").open("wb")
        started.append(
            subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address={address}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        process = started[-1]

        def ready() -> bool:
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            return _status(f"http://{address}/-/ready") == 200

        wait_for(ready, 60, "Prometheus ready")
        return f"http://{address}"

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status)
    except OSError:
        return None


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.loads(answer.read() or b"null") if answer.status == 200 else None
    except (OSError, ValueError):
        return None


def _query(api: str, expr: str) -> list[Any]:
    answer = _get(f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    if not answer or answer.get("status") != "success":
        return []
    return answer["data"]["result"]  # type: ignore[no-any-return]


class _Load:
    """Produce (acks=all: group commits), consume and commit as a group, until stopped."""

    def __init__(self, bootstrap: str) -> None:
        self.topic = f"dash-{uuid.uuid4().hex[:8]}"
        self.bootstrap = bootstrap
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Load:
        # A committed transaction first: producer ids and transaction states have a value.
        txn = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.topic})
        txn.init_transactions(30)
        txn.begin_transaction()
        txn.produce(self.topic, b"in a transaction")
        txn.commit_transaction(30)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)

    def _run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"g-{self.topic}",
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "auto.commit.interval.ms": 200,
            }
        )
        try:
            consumer.subscribe([self.topic])
            while not self.stop.is_set():
                for i in range(20):  # a light load: the machine is shared
                    producer.produce(self.topic, f"v{i}".encode())
                producer.flush(10)
                consumer.poll(0.05)
            producer.flush(10)
        except BaseException as e:
            self.error = e
        finally:
            consumer.close()


def test_every_dashboard_query_returns_data_from_a_real_prometheus(
    tmp_path: Path, prometheus: Any
) -> None:
    queries = dashboard_queries()
    assert queries, f"no queries in {DASHBOARD}"
    broker = EmbeddedBroker(
        tmp_path / "data",
        settings={"metrics.listen": "127.0.0.1:0", "group.initial.rebalance.delay.ms": "0"},
    ).start()
    try:
        assert broker.metrics_port is not None
        api = prometheus(broker.metrics_port)
        with _Load(broker.bootstrap) as load:
            empty = list(queries)

            def all_answered() -> bool:
                empty[:] = [(title, expr) for title, expr in empty if not _query(api, expr)]
                assert load.error is None, f"the load failed: {load.error!r}"
                return not empty

            wait_for(
                all_answered,
                120,
                lambda: f"data for every panel; none yet for {empty}",
                interval=1,
            )
    finally:
        broker.stop()
