"""`onceflow run file-transactions` on a 3-node Apache Kafka cluster while the leader of an
output partition, then the transaction coordinator of the sink's transactional ids, then
another node chosen at random are SIGKILLed and restarted, and the driver is SIGKILLed once
with a batch part-written: every line of every file named in a committed input transaction is
in the output once, every bad file in the dead letters once, and nothing of a file named only
in an aborted input transaction.

Its input is files, named by the records of a small topic: the leader that matters while it
reads is the one of the output partitions it writes in each file's transaction, so that and a
random node (which may lead the input or the coordinator's partition) stand for the input
partition's leader of the other pipelines' tests."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from pathlib import Path

import pytest

from onceflow.apache_kafka import KafkaCluster
from tests.apache_kafka.exactly_once import read_committed

from .apache_kafka_runs import Fault, InputWriter, PipelineRun, sink_faults

PARTITIONS = 2
FILES_PER_TRANSACTION = 4
LINES_PER_FILE = 25


def write_file(directory: Path, n: int) -> tuple[Path, bool]:
    """File `n`: CSV or JSON lines of LINES_PER_FILE transactions, or (one in nine) a CSV
    whose line 3 has no number, for the dead letters. The path, and whether it is good."""
    if n % 9 == 8:
        bad = directory / f"f{n}.csv"
        bad.write_text("id,amount\nx1,1\nx2,not-a-number\n")
        return bad, False
    ids = [f"f{n}-t{line}" for line in range(LINES_PER_FILE)]
    if n % 2:
        path = directory / f"f{n}.jsonl"
        path.write_text("".join(json.dumps({"id": i, "amount": n}) + "\n" for i in ids))
    else:
        path = directory / f"f{n}.csv"
        path.write_text("id,amount\n" + "".join(f"{i},{n}.5\n" for i in ids))
    return path, True


@pytest.mark.slow
# Three failovers and two Spark driver starts: 135 s here, 642 s at a load average of 33-60.
@pytest.mark.timeout(900)
def test_file_transactions_stay_exact_through_leader_coordinator_and_driver_kills(
    kafka_cluster3: KafkaCluster, tmp_path: Path
) -> None:
    cluster = kafka_cluster3
    bootstrap = cluster.bootstrap_servers
    tag = uuid.uuid4().hex[:8]
    locations, out, dead = f"files-{tag}", f"tx-{tag}", f"dlq-{tag}"
    prefix = f"files-{tag}"
    cluster.create_topic(locations, PARTITIONS)
    cluster.create_topic(out, PARTITIONS)
    cluster.create_topic(dead, 1)
    directory = tmp_path / "files"
    directory.mkdir()
    writer = InputWriter(bootstrap, locations, f"locations-{tag}")
    lines: Counter[tuple[str, int]] = Counter()  # (file, line) of the committed good files
    bad_files: Counter[str] = Counter()
    aborted: set[str] = set()
    files = 0
    transactions = 0

    def write_input(more: int) -> None:
        nonlocal files, transactions
        for _ in range(more):
            transactions += 1
            named = [write_file(directory, files + i) for i in range(FILES_PER_TRANSACTION)]
            files += len(named)
            wanted = transactions % 7 != 0  # some transactions aborted on purpose
            values = [str(path).encode() for path, _ in named]
            if not writer.write(values, partitions=(0, 1), commit=wanted):
                aborted.update(str(path) for path, _ in named)
                continue
            for path, good in named:
                if good:
                    lines.update((str(path), n) for n in range(1, LINES_PER_FILE + 1))
                else:
                    bad_files[str(path)] += 1

    rng = random.Random(tag)
    run = PipelineRun(
        cluster=cluster,
        pipeline="file-transactions",
        checkpoint=tmp_path / "checkpoint",
        output=out,
        args=[
            *("--input", locations, "--output", out, "--dead-letters", dead),
            *("--prefix", prefix, "--max-offsets-per-trigger", "12"),
        ],
        log=tmp_path / "driver.log",
    )
    run.through_faults(
        [
            *sink_faults(cluster, out, prefix),
            Fault(
                "a node chosen at random",
                lambda: rng.choice(sorted(set(cluster.nodes) - set(run.victims) or cluster.nodes)),
            ),
        ],
        write_input,
    )
    run.finish()
    seen = Counter(
        (row["source"], row["source_line"])
        for value, n in read_committed(bootstrap, out, PARTITIONS).items()
        for row in [json.loads(value)] * n
    )
    letters = Counter(
        json.loads(value)["location"] for value in read_committed(bootstrap, dead, 1).elements()
    )
    lost = sum((lines - seen).values()) + sum((bad_files - letters).values())
    duplicated = sum(n - 1 for n in [*seen.values(), *letters.values()] if n > 1)
    visible_aborted = len(aborted & ({source for source, _ in seen} | set(letters)))
    assert (lost, duplicated, visible_aborted) == (0, 0, 0), (
        f"lost {lost}, duplicated {duplicated}, aborted files visible {visible_aborted} "
        f"of {sum(lines.values())} committed lines and {len(bad_files)} bad files "
        f"(nodes killed: {run.victims})"
    )
    assert lines and bad_files and aborted  # every kind of input was there to be checked
