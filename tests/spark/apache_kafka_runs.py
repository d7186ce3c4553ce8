"""A bundled pipeline run with `onceflow run` (a driver subprocess) on the 3-node Apache Kafka
cluster through the faults of issue 20: nodes SIGKILLed and restarted one after another while
it reads and writes, then its driver SIGKILLed with a batch part-written, then a run to the end
of its input from the same checkpoint. The copy, wordcount and file-transactions tests share it;
each brings its own input, its own faults and its own check of the output."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException

from onceflow.apache_kafka import KafkaCluster
from tests.apache_kafka.exactly_once import transactional_producer, write_transaction
from tests.process_group import kill_process_group
from tests.waiting import wait_for

from .conftest import ROOT
from .kafka_io import end_offsets, wait_mid_batch

WriteInput = Callable[[int], None]
"""Writes that many more input transactions (some aborted, as the test chooses)."""


class InputWriter:
    """A pipeline's input written in transactions, committed or aborted, as an application
    writes them through the faults.

    An abort can fail fatally: with the leader of one of its partitions SIGKILLed, librdkafka
    sent EndTxn(ABORT) for a transaction the coordinator had not seen begin (its state still
    COMPLETE_COMMIT from the one before) and got INVALID_TXN_STATE (the symptom of
    librdkafka issue 4849, open). Nothing of the transaction committed;
    as librdkafka asks after a fatal error, the producer is made again (its init_transactions
    fences the old one and aborts whatever it left open)."""

    def __init__(self, bootstrap: str, topic: str, transactional_id: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.transactional_id = transactional_id
        self.producer = transactional_producer(bootstrap, transactional_id)

    def write(self, values: Sequence[bytes], *, commit: bool, partitions: Sequence[int]) -> bool:
        """True when the transaction of `values` committed."""
        try:
            return write_transaction(
                self.producer, self.topic, values, partitions=partitions, commit=commit
            )
        except AssertionError as failure:
            cause = failure.__cause__
            aborting = str(failure).startswith("abort failed")
            if not (aborting and isinstance(cause, KafkaException) and cause.args[0].fatal()):
                raise
        self.producer.purge()
        self.producer = transactional_producer(self.bootstrap, self.transactional_id)
        return False


@dataclass(frozen=True)
class Fault:
    """A node to SIGKILL and restart: `node_of()` says which, asked just before the kill."""

    what: str
    node_of: Callable[[], int]


def sink_faults(cluster: KafkaCluster, output: str, prefix: str) -> list[Fault]:
    """The sink's nodes: the leader of an output partition, then the transaction coordinator of
    the sink's `{prefix}-0`."""
    return [
        Fault("the leader of an output partition", lambda: cluster.leader(output, 1)),
        Fault(
            "the coordinator of the sink's transactional id",
            lambda: cluster.transaction_coordinator(f"{prefix}-0"),
        ),
    ]


def topic_pipeline_faults(
    cluster: KafkaCluster, source: str, output: str, prefix: str
) -> list[Fault]:
    """A topic-to-topic pipeline's nodes: the leader of an input partition, then the sink's."""
    return [
        Fault("the leader of an input partition", lambda: cluster.leader(source, 0)),
        *sink_faults(cluster, output, prefix),
    ]


@dataclass(frozen=True)
class PipelineRun:
    """`onceflow run PIPELINE --bootstrap-server CLUSTER --checkpoint CHECKPOINT ARGS...`,
    writing to `output` (the topic whose growth says a batch is part-written)."""

    cluster: KafkaCluster
    pipeline: str
    checkpoint: Path
    output: str
    args: Sequence[str]
    log: Path
    victims: list[int] = field(default_factory=list)  # the nodes killed, in order

    def start(self, *extra: str) -> subprocess.Popen:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        command = [
            sys.executable,
            "-m",
            "onceflow.cli.main",
            "run",
            self.pipeline,
            "--bootstrap-server",
            self.cluster.bootstrap_servers,
            "--checkpoint",
            str(self.checkpoint),
            *self.args,
            *extra,
        ]
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            # its own process group: the kill takes its JVM and Python workers down with it
            start_new_session=True,
        )

    def log_tail(self, chars: int = 5000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def through_faults(self, faults: Sequence[Fault], write_input: WriteInput) -> None:
        """Start the driver on 10 transactions of input; once it has written output, each
        fault in turn: kill the node, 5 more input transactions while it is down, restart it,
        5 more. Then more input and the driver SIGKILLed with a batch part-written."""
        bootstrap = self.cluster.bootstrap_servers
        write_input(10)
        driver = self.start()
        try:

            def first_output() -> bool:
                assert driver.poll() is None, f"the driver exited:\n{self.log_tail()}"
                return sum(end_offsets(bootstrap, self.output, "read_committed").values()) > 0

            # A Spark driver's start took 150 s at a load average of 80 on the shared machine.
            wait_for(
                first_output,
                480,
                lambda: f"the {self.pipeline}'s first output\n{self.log_tail(3000)}",
                interval=1,
            )
            for fault in faults:
                victim = fault.node_of()
                self.victims.append(victim)
                self.cluster.kill(victim)
                write_input(5)  # the pipeline reads and writes while the node is down
                self.cluster.restart(victim)
                # One failure at a time, as a rolling restart does: the next node dies only
                # once the restarted one is back in every ISR.
                self.cluster.wait_fully_replicated()
                write_input(5)
                assert driver.poll() is None, (
                    f"the driver died after {fault.what} (node {victim}) was killed:\n"
                    + self.log_tail()
                )
            self._wait_mid_batch(write_input)
        finally:
            kill_process_group(driver)

    def _wait_mid_batch(self, write_input: WriteInput, attempts: int = 3) -> None:
        """More input, until a batch is caught part-written (a small batch can finish between
        two looks; then the next input makes another)."""
        for attempt in range(attempts):
            write_input(10)
            try:
                wait_mid_batch(self.checkpoint, self.cluster.bootstrap_servers, self.output, -1, 90)
                return
            except AssertionError:
                if attempt == attempts - 1:
                    raise

    def finish(self, timeout_s: float = 300) -> None:
        """A new driver on the same checkpoint, to the end of the input (--until-caught-up)."""
        finish = self.start("--until-caught-up")
        try:
            assert finish.wait(timeout_s) == 0, self.log_tail()
        finally:
            kill_process_group(finish)
