"""The numbers one scrape shows, copied out of the broker on its event loop.

Reading is done in steps (one per partition or group) that the endpoint runs a few
milliseconds at a time; formatting them (collector.py) then runs in a thread on this copy, so
the loop is held only for the copy: about 5 us a partition, where formatting is ten times that.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

from onceflow.log.errors import LogClosedError
from onceflow.metrics.counters import BrokerCounters
from onceflow.metrics.histogram import Histogram
from onceflow.metrics.lag import PartitionLag, consumer_lag

Steps = Generator[None, None, "Snapshot"]

# (le, cumulative count) pairs and the sum: a histogram as it was.
HistogramCopy = tuple[list[tuple[str, int]], float]


@dataclass(frozen=True)
class BrokerState:
    """What a scrape reads of the broker, each through its owner's public accessors."""

    topics: Iterable[Any]  # TopicRegistry: Topic(name, partitions=[Partition])
    partition: Callable[[str, int], Any]  # TopicRegistry.partition
    transactions: Any  # TransactionCoordinator: transactions()
    groups: Any  # GroupCoordinator: list_groups(), offsets.committed()
    cleaner: Any  # LogCleaner: rounds, dropped, last_round
    quotas: Any  # ConnectionQuotas: total, refused
    committer: Any  # GroupCommitter: flushes
    transactions_load_seconds: float = 0.0  # loading __transaction_state at start


@dataclass(frozen=True, slots=True)
class PartitionRow:
    topic: str
    partition: int
    size: int
    log_end_offset: int
    log_start_offset: int
    segments: int
    producer_ids: int
    high_watermark: int


@dataclass
class Snapshot:
    # topic -> (messages in, bytes in, bytes out, failed produce, failed fetch)
    topics: dict[str, tuple[int, int, int, int, int]] = field(default_factory=dict)
    requests: dict[tuple[str, int], int] = field(default_factory=dict)
    total_time_ms: dict[str, HistogramCopy] = field(default_factory=dict)
    partitions: list[PartitionRow] = field(default_factory=list)
    flush_time_ms: HistogramCopy = ([], 0.0)
    records_per_flush: HistogramCopy = ([], 0.0)
    writers_per_flush: HistogramCopy = ([], 0.0)
    flushes: int = 0
    transactions: Counter[str] = field(default_factory=Counter)  # state name -> ids
    transactions_load_ms: float = 0.0
    groups: Counter[tuple[str, str]] = field(default_factory=Counter)  # (protocol, state)
    lag: list[PartitionLag] = field(default_factory=list)
    cleaner_rounds: int = 0
    cleaner_dropped: int = 0
    cleaner_last: tuple[float, int, int] | None = None  # seconds, bytes read, bytes written
    connections: int = 0
    refused: dict[str, int] = field(default_factory=dict)


def read_state(counters: BrokerCounters, state: BrokerState) -> Steps:
    """Copy what a scrape shows, yielding between partitions and between groups."""
    out = Snapshot()
    existing = set()
    for topic in list(state.topics):
        existing.add(topic.name)
        for p in list(topic.partitions):
            try:
                row = _partition_row(topic.name, p)
            except LogClosedError:
                continue  # deleted between two steps of the read
            out.partitions.append(row)
            yield
    for name, c in list(counters.topics.items()):
        if name not in existing:
            counters.forget_topic(name)  # deleted: its series end, as Kafka's do
            continue
        out.topics[name] = (
            c.messages_in,
            c.bytes_in,
            c.bytes_out,
            c.failed_produce,
            c.failed_fetch,
        )
    out.requests = {
        (name, version): count
        for name, by_version in counters.requests.items()
        for version, count in by_version.items()
    }
    out.total_time_ms = {name: _copy(h) for name, h in counters.total_time_ms.items() if h.count}
    out.flush_time_ms = _copy(counters.flush_time_ms)
    out.records_per_flush = _copy(counters.records_per_flush)
    out.writers_per_flush = _copy(counters.writers_per_flush)
    out.flushes = state.committer.flushes
    out.transactions = Counter(
        meta.state.kafka_name for meta in state.transactions.transactions().values()
    )
    out.transactions_load_ms = state.transactions_load_seconds * 1000
    yield
    listings = state.groups.list_groups()
    out.groups = Counter((g.group_type, g.state) for g in listings)
    for group_id in sorted({g.group_id for g in listings}):
        out.lag.extend(consumer_lag([group_id], state.groups.offsets, state.partition))
        yield
    cleaner = state.cleaner
    out.cleaner_rounds, out.cleaner_dropped = cleaner.rounds, cleaner.dropped
    last = cleaner.last_round
    if last is not None:
        out.cleaner_last = (last.seconds, last.bytes_read, last.bytes_written)
    out.connections = state.quotas.total
    out.refused = dict(state.quotas.refused)
    return out


def _partition_row(topic: str, p: Any) -> PartitionRow:
    log = p.log
    return PartitionRow(
        topic,
        p.index,
        log.size_in_bytes,
        log.log_end_offset,
        log.log_start_offset,
        len(log.segment_base_offsets),
        len(p.producers.producers()),
        p.high_watermark,
    )


def _copy(histogram: Histogram) -> HistogramCopy:
    return histogram.cumulative(), histogram.sum
