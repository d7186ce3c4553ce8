"""`onceflow bench-eos`'s transactional producer process: commits every commit_interval_ms,
aborts an evenly spread share of its transactions, and times each step of a transaction."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, Producer

from onceflow.bench.client_stats import ClientStats
from onceflow.bench.errors import STALL_TIMEOUT_S, BenchError
from onceflow.bench.producers import (
    PROGRESS_EVERY,
    ProducerJob,
    ProducerReport,
    await_go,
    serve_job,
    worker_entry,
)
from onceflow.tools.clients import REQUEST_TIMEOUT_S, ClientErrors, Cluster, client_config, drain

WORKER_MODULE = "onceflow.bench.eos_producer"
DEFAULT_COMMIT_INTERVAL_MS = 100
# The transactional producer looks at the clock every this many records: a few ms at most.
CLOCK_CHECK_EVERY = 64


@dataclass(frozen=True)
class TxnProducerJob(ProducerJob):
    """A ProducerJob with transactions: commit every commit_interval_ms, abort some."""

    transactional_id: str = ""
    commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS
    abort_ratio: float = 0.0


@dataclass
class TxnProducerReport(ProducerReport):
    committed_records: int = 0
    aborted_records: int = 0
    # Call durations in ms; the records are flushed first, so these are the commits alone.
    commit_ms: list[float] = field(default_factory=list)
    abort_ms: list[float] = field(default_factory=list)
    flush_ms: list[float] = field(default_factory=list)
    transaction_ms: list[float] = field(default_factory=list)
    # From begin_transaction() to the first record's acknowledgement (seen at a poll).
    first_ack_ms: list[float] = field(default_factory=list)


def aborts(index: int, ratio: float) -> bool:
    """Whether transaction `index` is aborted: evenly spread, `ratio` of them in all, the first
    half-way into the first stretch (the 5th of 10 at 0.1), so a short round has some too."""
    return math.floor((index + 1) * ratio + 0.5) > math.floor(index * ratio + 0.5)


def producer_worker_main() -> int:
    """Entry point of a transactional producer process (protocol: ProducerProcess)."""
    return serve_job(TxnProducerJob, TxnProducerReport, _produce_transactions)


def _produce_transactions(job: TxnProducerJob, report: TxnProducerReport) -> None:
    # When the open transaction began, until its first record is acknowledged.
    awaiting_first_ack: list[float] = []

    def on_delivery(error: KafkaError | None, _message: object) -> None:
        if report.count(error) and awaiting_first_ack:
            report.first_ack_ms.append((time.monotonic() - awaiting_first_ack.pop()) * 1000)

    errors = ClientErrors()
    stats = ClientStats()
    config = {
        **job.settings,
        **stats.settings(),
        "transactional.id": job.transactional_id,
        "on_delivery": on_delivery,
    }
    producer = Producer(client_config(Cluster(job.bootstrap), errors, config))
    # Connected, with a producer id and epoch, before the clock runs.
    producer.init_transactions(REQUEST_TIMEOUT_S)
    producer.list_topics(job.topic, timeout=REQUEST_TIMEOUT_S)
    payload = os.urandom(job.value_size)
    await_go()
    produce, poll, clock = producer.produce, producer.poll, time.monotonic
    interval_s = job.commit_interval_ms / 1000
    sent = index = 0
    report.started = clock()
    stats.start()
    while sent < job.records:
        producer.begin_transaction()
        began = clock()
        awaiting_first_ack[:] = [began]
        commit_at = began + interval_s
        in_transaction = 0
        while sent < job.records:
            try:
                produce(job.topic, payload)
            except BufferError:
                poll(0.001)  # local queue full: serve deliveries, then retry
                if clock() >= commit_at:
                    break  # a full queue must not stretch the transaction past its interval
                continue
            sent += 1
            in_transaction += 1
            if sent % CLOCK_CHECK_EVERY == 0:
                poll(0)
                if sent % PROGRESS_EVERY == 0:
                    print(f"progress {report.delivered}", flush=True)
                if clock() >= commit_at:
                    break
        _end_transaction(producer, report, aborts(index, job.abort_ratio), in_transaction)
        report.transaction_ms.append((clock() - began) * 1000)
        index += 1
        errors.raise_if_fatal()
    report.finished = clock()
    stats.final(poll)  # off the clock
    report.add_stats(stats)
    print(f"progress {report.delivered}", flush=True)


def _end_transaction(
    producer: Producer, report: TxnProducerReport, abort: bool, records: int
) -> None:
    """Flush, then commit or abort; the two are timed apart so a commit is the commit alone.

    commit_transaction() would flush by itself and the producer thread waits either way, so
    flushing first costs no throughput; it keeps the backlog's delivery out of the commit's
    figure. An aborted transaction's records are all written first, so read_committed
    consumers have aborted records to skip.
    """
    started = time.perf_counter()
    pending = drain(producer, STALL_TIMEOUT_S)
    if pending:
        raise BenchError(f"{pending} records still pending {STALL_TIMEOUT_S:g} s into a flush")
    flushed = time.perf_counter()
    if abort:
        producer.abort_transaction(REQUEST_TIMEOUT_S)
        report.aborted_records += records
    else:
        producer.commit_transaction(REQUEST_TIMEOUT_S)
        report.committed_records += records
    ended = time.perf_counter()
    report.flush_ms.append((flushed - started) * 1000)
    (report.abort_ms if abort else report.commit_ms).append((ended - flushed) * 1000)


if __name__ == "__main__":
    worker_entry(WORKER_MODULE, "bench-eos", producer_worker_main)
