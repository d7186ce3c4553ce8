"""`onceflow verify --client java`: the transactional roles (producer, copier) played by Kafka's
Java client, which uses transactions version 2 (KIP-890 part 2) when the broker finalizes it;
librdkafka has no version 2 (confluentinc/librdkafka#5423), so the Python workers never use it.

TransactionalWorker.java (package data beside this module) is compiled once a run with javac
against the fetched Kafka jars (source-file mode compiled it at every start: 7 s of the 2-core
machine for five workers, again at every restart after a crash); it takes the Python worker's
JSON argument and writes the same operation lines, so the pool, the faults and the checker
treat both alike. The readers stay Python.

Version 2 shows in the coordinator: EndTxn v5 bumps a transactional id's epoch at every commit
or abort, where version 1 bumps it only at InitProducerId. So after a run, each writer's epoch
(DescribeTransactions) is at least the number of transactions it ended (`version_2_evidence`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apache_kafka import Distribution, MissingTool, locate
from onceflow.apache_kafka.distribution import require_java
from onceflow.protocol.api_key import ApiKey
from onceflow.protocol.client import KafkaClient, KafkaClientError
from onceflow.protocol.entities import build
from onceflow.verify.history import FAIL, INVOKE, OK, TXN, Op
from onceflow.verify.workload import COPIER, PRODUCER

JAVA = "java"  # VerifyOptions.client of the Java worker (the default: "python")
JAVA_ROLES = (PRODUCER, COPIER)  # the transactional ones; readers stay Python
SOURCE = "TransactionalWorker.java"
MAIN = "TransactionalWorker"
COMPILE_TIMEOUT_S = 300.0  # javac on a loaded 2-core machine
HEAP = "192m"
ABORTED_ON_PURPOSE = "aborted on purpose"  # a transaction ended by abortTransaction


def source_path() -> Path:
    return Path(str(resources.files("onceflow.verify").joinpath(SOURCE)))


def javac() -> str:
    """The JDK's compiler: on PATH, or beside `java`."""
    found = shutil.which("javac")
    beside = Path(os.path.realpath(require_java())).parent / "javac"
    if found is None and not beside.is_file():
        raise MissingTool("javac is not installed (the Java client is compiled: a JDK 17 or later)")
    return found or str(beside)


def java_client() -> Distribution:
    """Kafka's jars for the Java worker: $ONCEFLOW_APACHE_KAFKA, the cache, or fetched now with
    Maven. Raises RuntimeError (MissingTool: no java, javac or mvn) or ValueError naming what
    is missing."""
    if not source_path().is_file():
        raise RuntimeError(f"{source_path()} is missing (onceflow installed without it)")
    javac()
    return locate()


@dataclass(frozen=True)
class JavaWorker:
    """The compiled worker: its classes beside Kafka's jars."""

    distribution: Distribution
    classes: Path

    def command(self, argument: str) -> list[str]:
        """The command line of one incarnation (ARGUMENT: the worker's JSON)."""
        command = self.distribution.command(MAIN, argument, heap=HEAP)
        at = command.index("-cp") + 1
        command[at] = f"{self.classes}{os.pathsep}{command[at]}"
        return command


def compile_worker(distribution: Distribution, into: Path) -> JavaWorker:
    """javac TransactionalWorker.java into `into` (RuntimeError with javac's output)."""
    into.mkdir(parents=True, exist_ok=True)
    command = [javac(), "-nowarn", "-cp", distribution.classpath, "-d", str(into)]
    done = subprocess.run(
        [*command, str(source_path())],
        capture_output=True,
        text=True,
        timeout=COMPILE_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"javac {SOURCE} failed: {(done.stdout + done.stderr)[-2000:]}")
    return JavaWorker(distribution, into)


def slot_of(process: str) -> str:
    """`producer0#3` -> `producer0`: the slot, whose name is the transactional.id."""
    return process.partition("#")[0]


def ended_transactions(ops: Iterable[Op]) -> Counter[str]:
    """Per writer slot, the transactions its clients surely ended with an EndTxn of a
    transaction that had added its partitions: committed, or aborted on purpose with every
    write delivered (an abort after an error, or of a transaction whose writes were refused,
    may not have reached the coordinator, or found nothing to end)."""
    ended: Counter[str] = Counter()
    writes: dict[str, int] = {}
    for op in ops:
        if op.f != TXN:
            continue
        txn = str(op.value.get("txn"))
        if op.type == INVOKE:
            writes[txn] = len(op.value.get("writes", []))
        elif op.type == OK or (
            op.type == FAIL
            and op.value.get("error") == ABORTED_ON_PURPOSE
            and len(op.value.get("delivered", [])) == writes.get(txn)
        ):
            ended[slot_of(op.process)] += 1
    return ended


def writer_epochs(bootstrap: str, transactional_ids: Iterable[str]) -> dict[str, int | None]:
    """Each transactional id's producer epoch at its coordinator (DescribeTransactions); None
    for an id the coordinator does not know."""
    epochs: dict[str, int | None] = {}
    client = KafkaClient(bootstrap).connect()
    try:
        for txn_id in transactional_ids:
            response = client.call_coordinator(
                txn_id,
                ApiKey.DESCRIBE_TRANSACTIONS,
                lambda cls, txn_id=txn_id: build(cls, transactional_ids=(txn_id,)),
                error_of=lambda r: r.transaction_states[0].error_code,
            )
            [state] = response.transaction_states
            epochs[txn_id] = state.producer_epoch if state.error_code == ErrorCode.none else None
    finally:
        client.close()
    return epochs


def version_2_evidence(
    bootstrap: str, ops: Iterable[Op], transactional_ids: Iterable[str]
) -> dict[str, Any]:
    """Each writer's epoch against the transactions it ended: version 2 (an epoch bump at every
    end) when every epoch is at least that count. Epochs are None if they cannot be read."""
    ids = list(transactional_ids)
    ended = ended_transactions(ops)
    try:
        epochs = writer_epochs(bootstrap, ids)
    except (KafkaClientError, OSError) as e:
        return {"error": f"DescribeTransactions failed: {e}"}
    version_2 = all(
        (epoch := epochs.get(name)) is not None and epoch >= ended[name] for name in ids
    )
    return {
        "epochs": epochs,
        "ended_transactions": {name: ended[name] for name in ids},
        "version_2": version_2 and sum(ended[name] for name in ids) > 0,
    }
