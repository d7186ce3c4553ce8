"""What the hot path bumps: plain ints and histograms in dicts, once per request or batch.

The event loop is the only writer and the scrape runs on the loop too (endpoint.py), so no
lock is taken; the collector turns these into Prometheus families at scrape time. A broker
without `metrics.listen` gets NO_COUNTERS, whose methods do nothing.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any

from onceflow.metrics.histogram import Histogram
from onceflow.protocol.api_key import ApiKey

# Milliseconds, as Kafka's TotalTimeMs and LogFlushRateAndTimeMs are.
MS_BUCKETS = (0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
RECORDS_BUCKETS = (1, 10, 100, 1000, 10_000, 100_000, 1_000_000)
WRITERS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

_BATCH_LENGTH = struct.Struct(">i")  # at byte 8 of a v2 batch: its length after that field
_RECORDS_COUNT_AT = 57  # v2 batch header: the records count (int32) is its last field
_LOG_OVERHEAD = 12  # base offset and batch length


def kafka_request_name(api_key: int) -> str:
    """Kafka's ApiKeys name, the `request` label of RequestMetrics: AddPartitionsToTxn."""
    return "".join(word.capitalize() for word in ApiKey(api_key).name.split("_"))


def records_count(data: bytes | memoryview) -> int:
    """Records in a (validated) Produce records field: the sum of its batches' counts."""
    count = 0
    at = 0
    end = len(data)
    while at + _RECORDS_COUNT_AT + 4 <= end:
        count += _BATCH_LENGTH.unpack_from(data, at + _RECORDS_COUNT_AT)[0]
        at += _LOG_OVERHEAD + _BATCH_LENGTH.unpack_from(data, at + 8)[0]
    return count


class TopicCounters:
    """kafka.server BrokerTopicMetrics of one topic."""

    __slots__ = ("bytes_in", "bytes_out", "failed_fetch", "failed_produce", "messages_in")

    def __init__(self) -> None:
        self.messages_in = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.failed_produce = 0
        self.failed_fetch = 0


class BrokerCounters:
    enabled = True

    def __init__(self) -> None:
        self.requests: dict[str, dict[int, int]] = {}  # request -> version -> count
        self.total_time_ms: dict[str, Histogram] = {}  # request -> TotalTimeMs
        self.topics: dict[str, TopicCounters] = {}
        self.flush_time_ms = Histogram(MS_BUCKETS)  # LogFlushRateAndTimeMs: one log's fsync
        self.records_per_flush = Histogram(RECORDS_BUCKETS)
        self.writers_per_flush = Histogram(WRITERS_BUCKETS)
        # FetchResponse v13+ names topics by id: the broker sets its registry's lookup.
        self.topic_by_id: Callable[[uuid.UUID], Any] = lambda _id: None

    def topic(self, name: str) -> TopicCounters:
        counters = self.topics.get(name)
        if counters is None:
            counters = self.topics[name] = TopicCounters()
        return counters

    def forget_topic(self, name: str) -> None:
        self.topics.pop(name, None)

    def request_timer(self, api_key: int) -> Histogram:
        name = kafka_request_name(api_key)
        return self.total_time_ms.setdefault(name, Histogram(MS_BUCKETS))

    def requests_by_version(self, request_name: str) -> dict[int, int]:
        """The counts of one API by version, which the dispatch bumps itself."""
        return self.requests.setdefault(request_name, {})

    # -- produce and fetch (BrokerTopicMetrics) -------------------------------------------

    def produced(self, topic: str, records: bytes | memoryview) -> None:
        """One partition's batches appended by a Produce."""
        counters = self.topic(topic)
        counters.messages_in += records_count(records)
        counters.bytes_in += len(records)

    def produce_failed(self, topic: str) -> None:
        self.topic(topic).failed_produce += 1

    def fetch_answered(self, response: Any) -> None:
        """A Fetch response as sent (a long poll reads more than once: only what is answered
        counts): records bytes out and failed partitions, per topic."""
        for topic_response in response.responses:
            name = getattr(topic_response, "topic", None)
            if name is None:  # v13+
                found = self.topic_by_id(topic_response.topic_id)
                if found is None:
                    continue
                name = found.name
            counters = self.topic(name)
            for part in topic_response.partitions:
                if part.error_code:
                    counters.failed_fetch += 1
                elif part.records:
                    counters.bytes_out += len(part.records)

    # -- group commit ---------------------------------------------------------------------

    def flushed(self, log: Any, flushed_from: int, writers: int, seconds: float) -> None:
        """One log's group-commit flush: its fsync time, records and writers it covered."""
        self.flush_time_ms.observe(seconds * 1000)
        self.records_per_flush.observe(max(log.flushed_offset - flushed_from, 0))
        self.writers_per_flush.observe(writers)


class _NoCounters(BrokerCounters):
    """The endpoint is off: nothing is counted (a call that returns at once)."""

    enabled = False

    def produced(self, topic: str, records: bytes | memoryview) -> None:
        pass

    def produce_failed(self, topic: str) -> None:
        pass

    def flushed(self, log: Any, flushed_from: int, writers: int, seconds: float) -> None:
        pass


NO_COUNTERS = _NoCounters()
