"""Every bundled pipeline through `spark-submit` on a Spark standalone cluster (a master and two
one-core workers from the pyspark package, separate executor JVMs), onceflow shipped with
`--py-files` (issue 11); the copy through a SIGKILL of an executor JVM, exactly once."""

from __future__ import annotations

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

from .cluster import StandaloneCluster, executor_python, onceflow_zip, submitted, wait_success
from .conftest import ROOT
from .copy_job import check_output
from .file_inputs import TRANSACTION_IDS, transaction_files
from .kafka_io import committed_batches, create_topic, produce, read_values, wait_mid_batch
from .mirror_runs import Source, check_mirrored
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
    with submitted(
        cluster, shipped, PIPELINES / script, *args, "--until-caught-up", log=log
    ) as job:
        wait_success(job, log, RUN_TIMEOUT_S)


SLOW_TRANSFORM = """
import time


def identity(key, value):
    time.sleep(0.005)
    return key, value
"""


def new_topics(bootstrap: str, *parts: str) -> list[str]:
    """Topics named `part-<random suffix>`, created."""
    suffix = uuid.uuid4().hex[:8]
    names = [f"{part}-{suffix}" for part in parts]
    for name in names:
        create_topic(bootstrap, name)
    return names


def test_wordcount(
    cluster: StandaloneCluster, shipped: Path, bootstrap: str, tmp_path: Path
) -> None:
    source, counts = new_topics(bootstrap, "sentences", "counts")
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
    locations, out, dlq = new_topics(bootstrap, "files", "tx", "dlq")
    files, bad = transaction_files(tmp_path)  # the executors share this machine's disk
    produce(bootstrap, locations, files)
    run(
        cluster, shipped, tmp_path, "file_transactions.py",
        "--bootstrap-server", bootstrap, "--input", locations, "--output", out,
        "--dead-letters", dlq, "--checkpoint", str(tmp_path / "cp"),
    )  # fmt: skip
    ids = sorted(r.key.decode() for r in read_topic(bootstrap, out))
    assert ids == TRANSACTION_IDS
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
    source, target = new_topics(bootstrap, "in", "out")
    values = [f"v{i}-" + "x" * 200 for i in range(3000)]
    produce(bootstrap, source, values)
    # a user's transform, shipped with --py-files too: it slows each task to about a second,
    # so that the kill lands inside a task
    (tmp_path / "slow_copy.py").write_text(SLOW_TRANSFORM)
    checkpoint, log = tmp_path / "cp", tmp_path / "copy.log"
    with submitted(
        cluster, f"{shipped},{tmp_path / 'slow_copy.py'}", PIPELINES / "copy_topic.py",
        "--bootstrap-server", bootstrap, "--input", source, "--output", target,
        "--checkpoint", str(checkpoint), "--max-offsets-per-trigger", "300",
        "--transform", "slow_copy:identity", "--until-caught-up", log=log,
    ) as job:  # fmt: skip
        # mid-batch: a micro-batch after the first has written part of its output, so the
        # executors (one task each) are inside their transactions
        wait_mid_batch(checkpoint, bootstrap, target, 0, RUN_TIMEOUT_S)
        assert job.poll() is None, "the copy ended before the fault: it proves nothing"
        victim = cluster.executor_pids()[0]
        os.kill(victim, signal.SIGKILL)
        done_before_kill = len(committed_batches(checkpoint))
        wait_success(job, log, RUN_TIMEOUT_S)
    assert done_before_kill < len(committed_batches(checkpoint)), "killed after the last batch"
    assert victim not in cluster.executor_pids()
    check_output(read_values(bootstrap, target), values, exactly_once=True)
