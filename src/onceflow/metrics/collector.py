"""The broker's metrics as Prometheus families, built at scrape time.

Names are those Prometheus's JMX exporter gives Kafka's MBeans with its example Kafka rules
(`lowercaseOutputName`, `kafka.<domain><type=T, name=N, k=v><>Count` -> `kafka_<domain>_t_n_total`
with label k, `...><>Value` -> a gauge `kafka_<domain>_t_n`), and kafka-exporter's for consumer
lag; what only onceflow has is named `onceflow_...`. Everything that is state (logs, producers,
transactions, groups, lag, the cleaner) is read here through the owners' public accessors, so
the hot path pays nothing for it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from onceflow.metrics.counters import BrokerCounters
from onceflow.metrics.histogram import Histogram
from onceflow.metrics.lag import consumer_lag
from onceflow.txn.transaction_state import TransactionState

GROUP_STATES = ("Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead")


@dataclass(frozen=True)
class BrokerState:
    """What the collector reads of the broker, each through its own public accessors."""

    topics: Iterable[Any]  # TopicRegistry: Topic(name, partitions=[Partition])
    partition: Callable[[str, int], Any]  # TopicRegistry.partition
    transactions: Any  # TransactionCoordinator: transactions()
    groups: Any  # GroupCoordinator: list_groups(), offsets.committed()
    cleaner: Any  # LogCleaner: rounds, dropped, last_round
    quotas: Any  # ConnectionQuotas: total, refused
    committer: Any  # GroupCommitter: flushes


class BrokerCollector(Collector):
    def __init__(self, counters: BrokerCounters, state: BrokerState) -> None:
        self.counters = counters
        self.state = state

    def collect(self) -> Iterator[Metric]:
        yield from self._topic_counters()
        yield from self._requests()
        yield from self._logs()
        yield from self._group_commit()
        yield from self._transactions()
        yield from self._groups()
        yield from self._cleaner()
        yield from self._connections()

    # -- counted on the hot path ----------------------------------------------------------

    def _topic_counters(self) -> Iterator[Metric]:
        families = {
            field: CounterMetricFamily(
                f"kafka_server_brokertopicmetrics_{name}",
                f"kafka.server:type=BrokerTopicMetrics,name={mbean},topic=*",
                labels=["topic"],
            )
            for field, name, mbean in (
                ("messages_in", "messagesin", "MessagesInPerSec"),
                ("bytes_in", "bytesin", "BytesInPerSec"),
                ("bytes_out", "bytesout", "BytesOutPerSec"),
                ("failed_produce", "failedproducerequests", "FailedProduceRequestsPerSec"),
                ("failed_fetch", "failedfetchrequests", "FailedFetchRequestsPerSec"),
            )
        }
        existing = {topic.name for topic in self.state.topics}
        for name, counters in list(self.counters.topics.items()):
            if name not in existing:
                self.counters.forget_topic(name)  # deleted: its series end, as Kafka's do
                continue
            for field, family in families.items():
                family.add_metric([name], getattr(counters, field))
        yield from families.values()

    def _requests(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "kafka_network_requestmetrics_requests",
            "kafka.network:type=RequestMetrics,name=RequestsPerSec,request=*,version=*",
            labels=["request", "version"],
        )
        for (name, version), count in sorted(self.counters.requests.items()):
            requests.add_metric([name, str(version)], count)
        yield requests
        total_time = HistogramMetricFamily(
            "kafka_network_requestmetrics_totaltimems",
            "kafka.network:type=RequestMetrics,name=TotalTimeMs,request=*: from dispatch to "
            "the response being ready, in ms",
            labels=["request"],
        )
        for name, histogram in sorted(self.counters.total_time_ms.items()):
            if histogram.count:
                total_time.add_metric([name], histogram.cumulative(), histogram.sum)
        yield total_time

    # -- state, read now ------------------------------------------------------------------

    def _logs(self) -> Iterator[Metric]:
        labels = ["topic", "partition"]
        size = GaugeMetricFamily(
            "kafka_log_log_size", "kafka.log:type=Log,name=Size", labels=labels
        )
        end = GaugeMetricFamily(
            "kafka_log_log_logendoffset", "kafka.log:type=Log,name=LogEndOffset", labels=labels
        )
        start = GaugeMetricFamily(
            "kafka_log_log_logstartoffset", "kafka.log:type=Log,name=LogStartOffset", labels=labels
        )
        segments = GaugeMetricFamily(
            "kafka_log_log_numlogsegments", "kafka.log:type=Log,name=NumLogSegments", labels=labels
        )
        producers = GaugeMetricFamily(
            "kafka_log_log_produceridcount",
            "Producer ids in the partition's producer state (Kafka's ProducerIdCount, per "
            "partition)",
            labels=labels,
        )
        hw = GaugeMetricFamily(
            "kafka_topic_partition_current_offset",
            "kafka-exporter: the partition's high watermark",
            labels=labels,
        )
        count = 0
        for topic in self.state.topics:
            for p in topic.partitions:
                key = [topic.name, str(p.index)]
                log = p.log
                size.add_metric(key, log.size_in_bytes)
                end.add_metric(key, log.log_end_offset)
                start.add_metric(key, log.log_start_offset)
                segments.add_metric(key, len(log.segment_base_offsets))
                producers.add_metric(key, len(p.producers.producers()))
                hw.add_metric(key, p.high_watermark)
                count += 1
        partitions = GaugeMetricFamily(
            "kafka_server_replicamanager_partitioncount",
            "kafka.server:type=ReplicaManager,name=PartitionCount",
            value=count,
        )
        yield from (size, end, start, segments, producers, hw, partitions)

    def _group_commit(self) -> Iterator[Metric]:
        yield _histogram(
            "kafka_log_logflushstats_logflushrateandtimems",
            "kafka.log:type=LogFlushStats,name=LogFlushRateAndTimeMs: one log's group-commit "
            "fsync, in ms",
            self.counters.flush_time_ms,
        )
        yield CounterMetricFamily(
            "onceflow_groupcommit_flushes",
            "Group-commit flushes (one per log per round; fsync off: none)",
            value=self.state.committer.flushes,
        )
        yield _histogram(
            "onceflow_groupcommit_records_per_flush",
            "Offsets (records) one flush made durable",
            self.counters.records_per_flush,
        )
        yield _histogram(
            "onceflow_groupcommit_writers_per_flush",
            "Writers (Produce requests, coordinator writes) that shared one flush",
            self.counters.writers_per_flush,
        )

    def _transactions(self) -> Iterator[Metric]:
        by_state = Counter(meta.state for meta in self.state.transactions.transactions().values())
        family = GaugeMetricFamily(
            "kafka_server_transaction_coordinator_metrics_transaction_count",
            "Transactional ids by transaction state (onceflow; in the family of Kafka's "
            "transaction-coordinator-metrics)",
            labels=["state"],
        )
        for state in TransactionState:
            if state is not TransactionState.DEAD:
                family.add_metric([state.kafka_name], by_state.get(state, 0))
        yield family

    def _groups(self) -> Iterator[Metric]:
        groups = self.state.groups
        listings = groups.list_groups()
        by_kind = Counter((g.group_type, g.state) for g in listings)
        family = GaugeMetricFamily(
            "kafka_server_group_coordinator_metrics_group_count",
            "Groups by protocol (classic, consumer) and state, as Kafka's "
            "group-coordinator-metrics group-count",
            labels=["protocol", "state"],
        )
        for state in GROUP_STATES:
            by_kind.setdefault(("classic", state), 0)
        for (protocol, state), n in sorted(by_kind.items()):
            family.add_metric([protocol, state], n)
        yield family
        lag = GaugeMetricFamily(
            "kafka_consumergroup_lag",
            "kafka-exporter: committed offset behind the last stable offset",
            labels=["consumergroup", "topic", "partition"],
        )
        current = GaugeMetricFamily(
            "kafka_consumergroup_current_offset",
            "kafka-exporter: the group's committed offset",
            labels=["consumergroup", "topic", "partition"],
        )
        lag_sum = GaugeMetricFamily(
            "kafka_consumergroup_lag_sum",
            "kafka-exporter: lag summed over the topic's partitions",
            labels=["consumergroup", "topic"],
        )
        sums: Counter[tuple[str, str]] = Counter()
        group_ids = sorted({g.group_id for g in listings})
        for row in consumer_lag(group_ids, groups.offsets, self.state.partition):
            key = [row.group, row.topic, str(row.partition)]
            lag.add_metric(key, row.lag)
            current.add_metric(key, row.committed)
            sums[(row.group, row.topic)] += row.lag
        for (group, topic), total in sorted(sums.items()):
            lag_sum.add_metric([group, topic], total)
        yield from (lag, current, lag_sum)

    def _cleaner(self) -> Iterator[Metric]:
        cleaner = self.state.cleaner
        yield CounterMetricFamily(
            "onceflow_log_cleaner_rounds", "Log cleaner rounds completed", value=cleaner.rounds
        )
        yield CounterMetricFamily(
            "onceflow_log_cleaner_dropped_rounds",
            "Log cleaner rounds given up (the partition changed under them)",
            value=cleaner.dropped,
        )
        last = cleaner.last_round
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
        if last is not None:
            clean_time.add_metric([], last.seconds)
            recopy.add_metric(
                [], 100 * last.bytes_written / last.bytes_read if last.bytes_read else 0
            )
            cleaned.add_metric(["read"], last.bytes_read)
            cleaned.add_metric(["written"], last.bytes_written)
        yield from (clean_time, recopy, cleaned)

    def _connections(self) -> Iterator[Metric]:
        quotas = self.state.quotas
        yield GaugeMetricFamily(
            "kafka_server_socket_server_metrics_connection_count",
            "Open client connections (kafka.server:type=socket-server-metrics connection-count)",
            value=quotas.total,
        )
        refused = CounterMetricFamily(
            "onceflow_server_connections_refused",
            "Connections closed at accept (max.connections.per.ip) or made to wait in the "
            "backlog (max.connections), by the limit",
            labels=["limit"],
        )
        for limit, n in sorted(quotas.refused.items()):
            refused.add_metric([limit], n)
        yield refused


def _histogram(name: str, documentation: str, histogram: Histogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation)
    family.add_metric([], histogram.cumulative(), histogram.sum)
    return family
