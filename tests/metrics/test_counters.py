"""The hot path's counters: record counts from batch headers, histograms, Kafka's API names."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from onceflow.metrics.collector import CHUNK, exposition
from onceflow.metrics.counters import kafka_request_name, records_count
from onceflow.metrics.histogram import Histogram
from onceflow.metrics.lag import PartitionLag
from onceflow.metrics.snapshot import PartitionRow, Snapshot
from onceflow.protocol.api_key import ApiKey
from onceflow.records.builder import build_batch


def test_records_count_sums_every_batch_of_a_produce() -> None:
    one = build_batch([(None, v, (), 0) for v in (b"a", b"b", b"c")])
    two = build_batch([(None, b"d", (), 0)] * 7)
    assert records_count(one) == 3
    assert records_count(one + two) == 10
    assert records_count(b"") == 0


def test_histogram_buckets_are_cumulative_with_prometheus_le() -> None:
    histogram = Histogram((1, 10))
    for value in (0.5, 1, 5, 10, 11):
        histogram.observe(value)
    assert histogram.cumulative() == [("1.0", 2), ("10.0", 4), ("+Inf", 5)]
    assert histogram.count == 5
    assert histogram.sum == 27.5


def test_request_names_are_kafkas() -> None:
    assert kafka_request_name(ApiKey.PRODUCE) == "Produce"
    assert kafka_request_name(ApiKey.ADD_PARTITIONS_TO_TXN) == "AddPartitionsToTxn"
    assert kafka_request_name(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS) == (
        "DescribeUserScramCredentials"
    )


def test_the_exposition_parses_back_with_every_label_as_it_was() -> None:
    group = 'a "quoted"\\group\nid'
    snapshot = Snapshot(
        partitions=[PartitionRow("t", i, 100, i, 0, 1, 2, i) for i in range(CHUNK + 3)],
        lag=[PartitionLag(group, "t", 0, 4, 10)],
    )
    text = run_now(exposition(snapshot)).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    lag_key = (("consumergroup", group), ("partition", "0"), ("topic", "t"))
    assert samples[("kafka_consumergroup_lag", lag_key)] == 6
    last = CHUNK + 2
    assert (
        samples[("kafka_log_log_logendoffset", (("partition", str(last)), ("topic", "t")))] == last
    )
    assert text.count("# TYPE kafka_log_log_size gauge") == 1  # one family across the chunks
    assert samples[("kafka_server_replicamanager_partitioncount", ())] == CHUNK + 3


def run_now(steps: Any) -> Any:
    try:
        while True:
            next(steps)
    except StopIteration as done:
        return done.value
