"""The Java producer 4.x on transactions version 2 (KIP-890 part 2), exact under kill -9.

Tv2Copier.java copies a topic with sendOffsetsToTransaction in transactions of at most 10
records. The broker is killed (SIGKILL) while it copies and restarted, then the copier itself
is killed and a new instance with the same transactional id carries on: the output holds every
input exactly once. Version 2 was really used: the coordinator's epoch moved with every commit
(it moves only on InitProducerId in the classic protocol) and the transaction records its
client's version 2.
"""

from __future__ import annotations

import subprocess
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from kio.schema.errors import ErrorCode

from onceflow.apache_kafka import Distribution
from onceflow.broker.embedded import EmbeddedBroker
from onceflow.protocol.api_key import ApiKey
from tests.confluent import create_topic, produce
from tests.eos.checker import read_back, wait_settled
from tests.waiting import wait_for
from tests.wire import WireClient

JAVA = Path(__file__).parent / "java"
TIMEOUT_S = 120.0  # JVMs start slowly on a shared 2-core machine
PHASE = 300  # input records per phase


class Copier:
    """Tv2Copier.java (source-file mode) as a child process, its lines collected."""

    def __init__(self, distribution: Distribution, *args: str) -> None:
        command = distribution.command(str(JAVA / "Tv2Copier.java"), *args)
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())

    def commits(self) -> list[int]:
        return [int(line.split()[1]) for line in list(self.lines) if line.startswith("copied ")]

    def copied(self) -> int:
        commits = self.commits()
        return commits[-1] if commits else 0

    def at_least(self, n: int) -> Callable[[], bool]:
        return lambda: self.copied() >= n

    def wait(self) -> int:
        try:
            return self.process.wait(TIMEOUT_S)
        finally:
            self._reader.join(10)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _epoch(bootstrap: str, transactional_id: str) -> int:
    with WireClient(bootstrap) as wire:
        answer = wire.request(
            ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=(transactional_id,)
        )
    [state] = answer.transaction_states
    assert state.error_code == ErrorCode.none
    return state.producer_epoch


def test_java_copier_on_version_2_is_exact_through_kill_9(
    apache_kafka: Distribution, make_broker: Callable[..., EmbeddedBroker]
) -> None:
    broker = make_broker()
    bootstrap = broker.bootstrap
    tag = uuid.uuid4().hex[:8]
    source, sink, group, txn_id = f"tv2in-{tag}", f"tv2out-{tag}", f"tv2g-{tag}", f"tv2-{tag}"
    create_topic(bootstrap, source, 4)
    create_topic(bootstrap, sink, 1)
    args = (bootstrap, group, source, sink, txn_id)
    produce(bootstrap, source, [str(i).encode() for i in range(PHASE)])
    first = Copier(apache_kafka, *args, "60000")
    second: Copier | None = None
    try:
        wait_for(first.at_least(PHASE), TIMEOUT_S, lambda: first.lines[-5:])
        # The broker dies while the copier is inside a transaction, and comes back.
        produce(bootstrap, source, [str(i).encode() for i in range(PHASE, 2 * PHASE)])
        wait_for(first.at_least(PHASE + 10), TIMEOUT_S, lambda: first.lines[-5:])
        broker.kill()
        broker.start()
        wait_for(first.at_least(2 * PHASE), TIMEOUT_S, lambda: first.lines[-5:])
        # Now the copier dies; a new instance with its transactional id fences it.
        produce(bootstrap, source, [str(i).encode() for i in range(2 * PHASE, 3 * PHASE)])
        wait_for(first.at_least(2 * PHASE + 10), TIMEOUT_S, lambda: first.lines[-5:])
        first.kill()
        epoch_before = _epoch(bootstrap, txn_id)
        second = Copier(apache_kafka, *args, "8000")
        assert second.wait() == 0, second.lines[-20:]
    finally:
        first.kill()
        if second is not None:
            second.kill()
    wait_settled(bootstrap, [(sink, 0)])  # the last commit's markers written
    [read] = read_back(bootstrap, [(sink, 0)]).values()
    got = sorted(int(v) for v in read.committed)
    assert got == list(range(3 * PHASE)), (
        sorted(set(range(3 * PHASE)) - set(got))[:50],
        first.lines[-30:],
        second.lines[-30:],
    )
    # Version 2: every commit of the second copier bumped the epoch (its InitProducerId, and
    # the abort of the first one's open transaction, add at most 3 more).
    commits = len(second.commits())
    assert commits >= 5, second.lines[-20:]
    assert _epoch(bootstrap, txn_id) - epoch_before >= commits, (epoch_before, commits)
