"""Every bundled pipeline through `spark-submit` on a Spark standalone cluster (a master and two
one-core workers from the pyspark package, separate executor JVMs), onceflow shipped with
`--py-files` (issue 11); the copy through a SIGKILL of an executor JVM, exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.pipelines.topic_reader import read_topic
from onceflow.pipelines.wordcount_check import check_counts, words_of

from .cluster import StandaloneCluster, executor_python, onceflow_zip, submit
from .conftest import ROOT
from .copy_job import check_output
from .kafka_io import committed_batches, create_topic, produce, read_values, wait_mid_batch
from .test_mirror import Source, check_mirrored
from .word_count_runs import sentences

PIPELINES = ROOT / "src" / "onceflow" / "pipelines"
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    python = executor_python(tmp_path_factory.mktemp("executor-python") / "env")
    found = subprocess.run(
        [str(python), "-c", "import confluent_kafka, pyarrow, pyspark; import onceflow"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        timeout=60,
    )
    # the cluster's Python has the dependencies, and onceflow only if it is shipped
    assert "No module named 'onceflow'" in found.stderr, found.stderr
    return python


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return onceflow_zip(ROOT / "src", tmp_path_factory.mktemp("ship") / "onceflow.zip")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, python: Path) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"), python)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def run(cluster: StandaloneCluster, shipped: Path, tmp_path: Path, script: str, *args: str) -> None:
    """spark-submit `script` with `args` (it stops once caught up); it must exit 0."""
    log = tmp_path / f"{script}.log"
    job = submit(cluster, shipped, PIPELINES / script, *args, "--until-caught-up", log=log)
    try:
        code = job.wait(RUN_TIMEOUT_S)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
    assert code == 0, log.read_text()[-4000:]


SLOW_TRANSFORM = """
import time


def identity(key, value):
    time.sleep(0.005)
    return key, value
"""


def names(*parts: str) -> list[str]:
    suffix = uuid.uuid4().hex[:8]
    return [f"{part}-{suffix}" for part in parts]


def test_wordcount(
    cluster: StandaloneCluster, shipped: Path, bootstrap: str, tmp_path: Path
) -> None:
    source, counts = names("sentences", "counts")
    for topic in (source, counts):
        create_topic(bootstrap, topic)
    written = sentences(300)
    produce(bootstrap, source, written)
    run(
        cluster, shipped, tmp_path, "wordcount.py",
        "--bootstrap-server", bootstrap, "--input", source, "--output", counts,
        "--checkpoint", str(tmp_path / "cp"), "--max-offsets-per-trigger", "100",
    )  # fmt: skip
    truth = Counter(w for s in written for w in words_of(s))
    report = check_counts(truth, read_topic(bootstrap, counts))
    assert report.exact, report


def test_file_transactions(
    cluster: StandaloneCluster, shipped: Path, bootstrap: str, tmp_path: Path
) -> None:
    locations, out, dlq = names("files", "tx", "dlq")
    for topic in (locations, out, dlq):
        create_topic(bootstrap, topic)
    good = tmp_path / "good.csv"  # the executors share this machine's disk
    good.write_text("id,amount\n" + "".join(f"t{i},{i}.5\n" for i in range(50)))
    lines = tmp_path / "more.jsonl"
    lines.write_text("".join(json.dumps({"id": f"j{i}", "amount": i}) + "\n" for i in range(30)))
    bad = tmp_path / "bad.csv"
    bad.write_text("id,amount\nx1,1\nx2,not-a-number\n")
    produce(bootstrap, locations, [str(good), lines.as_uri(), str(bad)])
    run(
        cluster, shipped, tmp_path, "file_transactions.py",
        "--bootstrap-server", bootstrap, "--input", locations, "--output", out,
        "--dead-letters", dlq, "--checkpoint", str(tmp_path / "cp"),
    )  # fmt: skip
    ids = sorted(r.key.decode() for r in read_topic(bootstrap, out))
    assert ids == sorted([f"t{i}" for i in range(50)] + [f"j{i}" for i in range(30)])
    [letter] = read_topic(bootstrap, dlq)
    assert letter.key == str(bad).encode()


def test_mirror(
    cluster: StandaloneCluster,
    shipped: Path,
    make_broker: Callable[..., EmbeddedBroker],
    tmp_path: Path,
) -> None:
    src = make_broker(tmp_path / "source").bootstrap
    dst = make_broker(tmp_path / "target").bootstrap
    create_topic(src, "orders", 2)
    orders = Source(src, "orders")
    orders.write(400)  # every third transaction aborted
    run(
        cluster, shipped, tmp_path, "mirror.py",
        "--source-bootstrap-server", src, "--target-bootstrap-server", dst,
        "--topics", "orders", "--checkpoint", str(tmp_path / "cp"),
        "--max-offsets-per-trigger", "120",
    )  # fmt: skip
    check_mirrored(orders, dst, "source.orders")


def test_copy_through_an_executor_sigkill(
    cluster: StandaloneCluster, shipped: Path, bootstrap: str, tmp_path: Path
) -> None:
    source, target = names("in", "out")
    for topic in (source, target):
        create_topic(bootstrap, topic)
    values = [f"v{i}-" + "x" * 200 for i in range(3000)]
    produce(bootstrap, source, values)
    # a user's transform, shipped with --py-files too: it slows each task to about a second,
    # so that the kill lands inside a task
    (tmp_path / "slow_copy.py").write_text(SLOW_TRANSFORM)
    checkpoint, log = tmp_path / "cp", tmp_path / "copy.log"
    job = submit(
        cluster, f"{shipped},{tmp_path / 'slow_copy.py'}", PIPELINES / "copy_topic.py",
        "--bootstrap-server", bootstrap, "--input", source, "--output", target,
        "--checkpoint", str(checkpoint), "--max-offsets-per-trigger", "300",
        "--transform", "slow_copy:identity", "--until-caught-up", log=log,
    )  # fmt: skip
    try:
        # mid-batch: a micro-batch after the first has written part of its output, so the
        # executors (one task each) are inside their transactions
        wait_mid_batch(checkpoint, bootstrap, target, 0, RUN_TIMEOUT_S)
        assert job.poll() is None, "the copy ended before the fault: it proves nothing"
        victim = cluster.executor_pids()[0]
        os.kill(victim, signal.SIGKILL)
        done_before_kill = len(committed_batches(checkpoint))
        code = job.wait(RUN_TIMEOUT_S)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
    assert code == 0, log.read_text()[-4000:]
    assert done_before_kill < len(committed_batches(checkpoint)), "killed after the last batch"
    assert victim not in cluster.executor_pids()
    check_output(read_values(bootstrap, target), values, exactly_once=True)
