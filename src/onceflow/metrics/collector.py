"""A scrape's snapshot as Prometheus's text format, in steps (endpoint.py runs them on the
event loop a few milliseconds at a time). prometheus_client formats the small families (about
20 us a sample: it validates every label name); the gauges with a row per partition or per
committed offset are written here, CHUNK rows a step, at about 2 us a row.

Names are those Prometheus's JMX exporter gives Kafka's MBeans with its example Kafka rules
(`lowercaseOutputName`; `kafka.<domain><type=T, name=N, k=v><>Count` becomes the counter
`kafka_<domain>_t_n_total{k}`, `...><>Value` the gauge `kafka_<domain>_t_n`), and
kafka-exporter's for consumer lag; what only onceflow has is named `onceflow_...`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, TypeVar

from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from onceflow.metrics.lag import PartitionLag
from onceflow.metrics.snapshot import HistogramCopy, PartitionRow, Snapshot
from onceflow.txn.transaction_state import TransactionState

CHUNK = 500  # rows of one family formatted in one step (about a millisecond)
R = TypeVar("R")

GROUP_STATES = ("Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead")
TRANSACTION_STATES = tuple(s.kafka_name for s in TransactionState if s is not TransactionState.DEAD)
_TOPIC_COUNTERS = (
    ("messagesin", "MessagesInPerSec"),
    ("bytesin", "BytesInPerSec"),
    ("bytesout", "BytesOutPerSec"),
    ("failedproducerequests", "FailedProduceRequestsPerSec"),
    ("failedfetchrequests", "FailedFetchRequestsPerSec"),
)


def exposition(snapshot: Snapshot) -> Generator[None, None, bytes]:
    """The text format of `snapshot`, one step per family or chunk of rows."""
    out: list[bytes] = []
    for part in _families(snapshot):
        out.append(part if isinstance(part, bytes) else generate_latest(_One(part)))  # type: ignore[arg-type]
        yield
    return b"".join(out)


class _One:
    """One family, as generate_latest reads a registry."""

    def __init__(self, family: Metric) -> None:
        self.family = family

    def collect(self) -> Iterator[Metric]:
        yield self.family


def _families(s: Snapshot) -> Iterator[Metric | bytes]:
    for whole in (
        _topic_counters(s),
        _requests(s),
        _group_commit(s),
        _transactions(s),
        _group_counts(s),
        _cleaner(s),
        _connections(s),
    ):
        yield from whole
    yield from _logs(s)
    yield from _lag(s)


def _gauge_rows(
    rows: Sequence[R],
    name: str,
    documentation: str,
    labels: tuple[str, ...],
    sample: Callable[[R], tuple[tuple[str, ...], float]],
) -> Iterator[bytes]:
    """A gauge family with a sample per row: its HELP and TYPE, then CHUNK rows at a time."""
    yield f"# HELP {name} {_escape_help(documentation)}\n# TYPE {name} gauge\n".encode()
    for start in range(0, len(rows), CHUNK):
        lines = []
        for row in rows[start : start + CHUNK]:
            values, value = sample(row)
            pairs = ",".join(
                f'{label}="{_escape(v)}"' for label, v in zip(labels, values, strict=True)
            )
            lines.append(f"{name}{{{pairs}}} {floatToGoString(value)}\n")
        yield "".join(lines).encode()


def _escape(value: str) -> str:
    # The text format's label value escapes (topic names never need them; group ids may).
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _topic_counters(s: Snapshot) -> Iterator[Metric]:
    families = [
        CounterMetricFamily(
            f"kafka_server_brokertopicmetrics_{name}",
            f"kafka.server:type=BrokerTopicMetrics,name={mbean},topic=*",
            labels=["topic"],
        )
        for name, mbean in _TOPIC_COUNTERS
    ]
    for topic, values in sorted(s.topics.items()):
        for family, value in zip(families, values, strict=True):
            family.add_metric([topic], value)
    yield from families


def _requests(s: Snapshot) -> Iterator[Metric]:
    requests = CounterMetricFamily(
        "kafka_network_requestmetrics_requests",
        "kafka.network:type=RequestMetrics,name=RequestsPerSec,request=*,version=*",
        labels=["request", "version"],
    )
    for (name, version), count in sorted(s.requests.items()):
        requests.add_metric([name, str(version)], count)
    yield requests
    total_time = HistogramMetricFamily(
        "kafka_network_requestmetrics_totaltimems",
        "kafka.network:type=RequestMetrics,name=TotalTimeMs,request=*: from dispatch to the "
        "response being ready, in ms",
        labels=["request"],
    )
    for name, (buckets, total) in sorted(s.total_time_ms.items()):
        total_time.add_metric([name], buckets, total)
    yield total_time


_LOG_GAUGES: tuple[tuple[str, str, Callable[[PartitionRow], int]], ...] = (
    ("kafka_log_log_size", "kafka.log:type=Log,name=Size", lambda r: r.size),
    (
        "kafka_log_log_logendoffset",
        "kafka.log:type=Log,name=LogEndOffset",
        lambda r: r.log_end_offset,
    ),
    (
        "kafka_log_log_logstartoffset",
        "kafka.log:type=Log,name=LogStartOffset",
        lambda r: r.log_start_offset,
    ),
    (
        "kafka_log_log_numlogsegments",
        "kafka.log:type=Log,name=NumLogSegments",
        lambda r: r.segments,
    ),
    (
        "kafka_log_log_produceridcount",
        "Producer ids in the partition's producer state (Kafka's ProducerIdCount, per partition)",
        lambda r: r.producer_ids,
    ),
    (
        "kafka_topic_partition_current_offset",
        "kafka-exporter: the partition's high watermark",
        lambda r: r.high_watermark,
    ),
)


def _logs(s: Snapshot) -> Iterator[Metric | bytes]:
    for name, documentation, field in _LOG_GAUGES:

        def sample(row: PartitionRow, field: Any = field) -> tuple[tuple[str, ...], float]:
            return (row.topic, str(row.partition)), field(row)

        yield from _gauge_rows(s.partitions, name, documentation, ("topic", "partition"), sample)
    yield GaugeMetricFamily(
        "kafka_server_replicamanager_partitioncount",
        "kafka.server:type=ReplicaManager,name=PartitionCount",
        value=len(s.partitions),
    )


def _group_commit(s: Snapshot) -> Iterator[Metric]:
    yield _histogram(
        "kafka_log_logflushstats_logflushrateandtimems",
        "kafka.log:type=LogFlushStats,name=LogFlushRateAndTimeMs: one log's group-commit fsync, "
        "in ms",
        s.flush_time_ms,
    )
    yield CounterMetricFamily(
        "onceflow_groupcommit_flushes",
        "Group-commit flushes (one per log per round; with fsync off, none)",
        value=s.flushes,
    )
    yield _histogram(
        "onceflow_groupcommit_records_per_flush",
        "Offsets (records) one flush made durable",
        s.records_per_flush,
    )
    yield _histogram(
        "onceflow_groupcommit_writers_per_flush",
        "Writers (Produce requests, coordinator writes) that shared one flush",
        s.writers_per_flush,
    )


def _transactions(s: Snapshot) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "kafka_server_transaction_coordinator_metrics_partition_load_time_max",
        "transaction-coordinator-metrics partition-load-time-max: loading the transaction log "
        "at start, in ms",
        value=s.transactions_load_ms,
    )
    family = GaugeMetricFamily(
        "kafka_server_transaction_coordinator_metrics_transaction_count",
        "Transactional ids by transaction state (onceflow; in the family of Kafka's "
        "transaction-coordinator-metrics)",
        labels=["state"],
    )
    for state in TRANSACTION_STATES:
        family.add_metric([state], s.transactions.get(state, 0))
    yield family


def _group_counts(s: Snapshot) -> Iterator[Metric]:
    by_kind = Counter(s.groups)
    for state in GROUP_STATES:
        by_kind.setdefault(("classic", state), 0)
    family = GaugeMetricFamily(
        "kafka_server_group_coordinator_metrics_group_count",
        "Groups by protocol (classic, consumer) and state, as Kafka's group-coordinator-metrics "
        "group-count",
        labels=["protocol", "state"],
    )
    for (protocol, state), n in sorted(by_kind.items()):
        family.add_metric([protocol, state], n)
    yield family


def _lag(s: Snapshot) -> Iterator[Metric | bytes]:
    labels = ("consumergroup", "topic", "partition")

    def key(row: PartitionLag) -> tuple[str, ...]:
        return (row.group, row.topic, str(row.partition))

    yield from _gauge_rows(
        s.lag,
        "kafka_consumergroup_lag",
        "kafka-exporter: committed offset behind the last stable offset",
        labels,
        lambda row: (key(row), row.lag),
    )
    yield from _gauge_rows(
        s.lag,
        "kafka_consumergroup_current_offset",
        "kafka-exporter: the group's committed offset",
        labels,
        lambda row: (key(row), row.committed),
    )
    sums: Counter[tuple[str, str]] = Counter()
    for row in s.lag:
        sums[(row.group, row.topic)] += row.lag
    lag_sum = GaugeMetricFamily(
        "kafka_consumergroup_lag_sum",
        "kafka-exporter: lag summed over the topic's partitions",
        labels=["consumergroup", "topic"],
    )
    for (group, topic), total in sorted(sums.items()):
        lag_sum.add_metric([group, topic], total)
    yield lag_sum


def _cleaner(s: Snapshot) -> Iterator[Metric]:
    yield CounterMetricFamily(
        "onceflow_log_cleaner_rounds", "Log cleaner rounds completed", value=s.cleaner_rounds
    )
    yield CounterMetricFamily(
        "onceflow_log_cleaner_dropped_rounds",
        "Log cleaner rounds given up (the partition changed under them)",
        value=s.cleaner_dropped,
    )
    clean_time = GaugeMetricFamily(
        "kafka_log_logcleaner_max_clean_time_secs",
        "kafka.log:type=LogCleaner,name=max-clean-time-secs: the last round's time",
    )
    recopy = GaugeMetricFamily(
        "kafka_log_logcleaner_cleaner_recopy_percent",
        "kafka.log:type=LogCleaner,name=cleaner-recopy-percent: of the last round",
    )
    cleaned = GaugeMetricFamily(
        "onceflow_log_cleaner_last_round_bytes",
        "Bytes the last cleaner round read and wrote",
        labels=["direction"],
    )
    if s.cleaner_last is not None:
        seconds, read, written = s.cleaner_last
        clean_time.add_metric([], seconds)
        recopy.add_metric([], 100 * written / read if read else 0)
        cleaned.add_metric(["read"], read)
        cleaned.add_metric(["written"], written)
    yield from (clean_time, recopy, cleaned)


def _connections(s: Snapshot) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "kafka_server_socket_server_metrics_connection_count",
        "Open client connections (kafka.server:type=socket-server-metrics connection-count)",
        value=s.connections,
    )
    refused = CounterMetricFamily(
        "onceflow_server_connections_refused",
        "Connections closed by a limit (max.connections.per.ip at accept, "
        "socket.request.max.bytes, sasl.server.max.receive.size, queued.max.request.bytes, "
        "connections.max.idle.ms) or made to wait in the backlog (max.connections)",
        labels=["limit"],
    )
    for limit, n in sorted(s.refused.items()):
        refused.add_metric([limit], n)
    yield refused


def _histogram(name: str, documentation: str, copy: HistogramCopy) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation)
    buckets, total = copy
    if buckets:
        family.add_metric([], buckets, total)
    return family
