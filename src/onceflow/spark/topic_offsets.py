"""Driver-side look-ups: which partitions a source reads, and their earliest and latest offsets.

"Latest" under read_committed is the last stable offset (ListOffsets with READ_COMMITTED), so a
micro-batch never plans past a transaction that is still open.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, OffsetSpec

from onceflow.kafka_errors import kafka_error_code, retriable, retry_transient
from onceflow.lazy_clients import HoldsClients, client_property
from onceflow.offset_lookup import IncompleteAnswerError, isolation_level, list_offsets
from onceflow.spark.offset_ranges import PartitionOffsets, TopicPartitionKey
from onceflow.spark.options import SourceOptions

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# Topics the cluster keeps for itself; a pattern subscription never means them.
_INTERNAL = ("__consumer_offsets", "__transaction_state")

# Consumer-only settings that an admin client would warn about.
_CONSUMER_ONLY = ("isolation.level", "group.id", "fetch.min.bytes", "fetch.wait.max.ms")


class OffsetLookupError(RuntimeError):
    """The cluster did not answer a metadata or ListOffsets request within the retries."""


# What a restarting broker answers, waited for within a look-up's request timeout.
_TRANSIENT_CODES = frozenset(
    {
        KafkaError._NOENT,  # "No leaders found": the metadata has no leader yet
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        # a leader just elected, its high watermark not caught up yet (retriable in Kafka)
        KafkaError.OFFSET_NOT_AVAILABLE,
    }
)
_TRANSIENT_BACKOFF_S = 0.1
# One ListOffsets or metadata call's timeout within an attempt's api_timeout_s. librdkafka's
# AdminClient sends a partition's ListOffsets to its cached leader and, when that leader was
# SIGKILLed, answers no offset only once the call's timeout has run out: with 30 s calls one
# dead leader used up every attempt of a micro-batch's look-up (the query failed, Kafka 4.4).
# Short calls, each answer without an offset followed by a new client, find the new leader
# seconds after the election.
_CALL_TIMEOUT_S = 5.0
# Answers that say the admin client's metadata is stale: a leader moved. Kafka's AdminClient
# refreshes its metadata on these; librdkafka's keeps the cached leader and epoch
# (FENCED_LEADER_EPOCH for over 15 s, measured on Kafka 4.4) until a Metadata request of the
# topic updates its cache.
_STALE_METADATA_CODES = frozenset(
    {
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
    }
)


def _transient(exc: Exception) -> bool:
    return isinstance(exc, IncompleteAnswerError) or retriable(exc, _TRANSIENT_CODES)


def _stale_metadata(exc: Exception) -> bool:
    return kafka_error_code(exc) in _STALE_METADATA_CODES


class TopicAuthorizationError(PermissionError):
    """A subscribed topic is not visible to this principal (no Describe ACL): as Spark's Kafka
    source (TopicAuthorizationException), fail rather than read nothing. Never retried."""


class TopicOffsets(HoldsClients):
    """Partitions and offsets of a subscription, through an AdminClient made on first use.

    Held by the driver-side reader, which lives in one Python process for the whole query;
    the client is made lazily so that the reader stays picklable until then.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    @client_property
    def admin(self) -> AdminClient:
        return self.make_admin()

    def make_admin(self) -> AdminClient:
        """A new AdminClient (the first, and each one after an answer without an offset)."""
        conf = {k: v for k, v in self.options.client.items() if k not in _CONSUMER_ONLY}
        return AdminClient(conf)

    @property
    def _call_timeout_s(self) -> float:
        return min(_CALL_TIMEOUT_S, self.options.request_timeout_s)

    def _retrying(self, what: str, call: Callable[[], _T]) -> _T:
        """`call`, again after a failure. A broker restarting (no leader, a lost connection,
        an answer without an offset) is waited for up to api_timeout_s, as Kafka's
        AdminClient retries within default.api.timeout.ms; a look-up still failing then, or
        failing otherwise, is one of the fetchOffset.numRetries + 1 attempts, spaced by
        fetchOffset.retryIntervalMs, after which OffsetLookupError."""
        attempts = self.options.fetch_offset_retries + 1
        for attempt in range(attempts):
            try:
                return retry_transient(
                    call,
                    _transient,
                    within_s=self.options.api_timeout_s,
                    backoff_s=_TRANSIENT_BACKOFF_S,
                    what=what,
                )
            except (KafkaException, IncompleteAnswerError) as exc:
                if attempt + 1 == attempts:
                    raise OffsetLookupError(f"{what} failed after {attempts} attempts") from exc
                log.warning("%s failed (attempt %d): %s", what, attempt + 1, exc)
                time.sleep(self.options.fetch_offset_retry_interval_ms / 1000.0)
        raise AssertionError("unreachable")

    def partitions(self) -> list[TopicPartitionKey]:
        """The partitions the subscription covers now, sorted; topics not there yet give none."""
        subscription = self.options.subscription
        if subscription.assigned:
            return list(subscription.assigned)

        def lookup() -> list[TopicPartitionKey]:
            metadata = self.admin.list_topics(timeout=self.options.request_timeout_s)
            found = []
            for name, topic in metadata.topics.items():
                if name in _INTERNAL or topic.error is not None:
                    continue
                if subscription.matches(name):
                    found.extend((name, p) for p in topic.partitions)
            self._check_authorized([t for t in subscription.topics if t not in metadata.topics])
            return sorted(found)

        return self._retrying("listing topics", lookup)

    def _check_authorized(self, missing: list[str]) -> None:
        """Subscribed topics absent from the metadata: not there yet (fine, as Spark), or hidden
        from this principal (an error). DescribeTopics tells them apart without creating a topic
        (a Metadata request naming it could, with auto.create.topics.enable)."""
        if not missing:
            return
        futures = self.admin.describe_topics(
            TopicCollection(missing), request_timeout=self.options.request_timeout_s
        )
        for name, future in futures.items():
            try:
                future.result()
            except KafkaException as exc:
                code = kafka_error_code(exc)
                if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    raise TopicAuthorizationError(
                        f"topic {name!r}: TOPIC_AUTHORIZATION_FAILED (no Describe ACL)"
                    ) from exc
                if code != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise

    def _list_offsets(
        self,
        tps: Iterable[TopicPartitionKey],
        spec: OffsetSpec,
        isolation: IsolationLevel,
        known: PartitionOffsets | None = None,
    ) -> PartitionOffsets:
        """Offsets of `tps`; with `known` (what the query has read), an answer behind it is
        fetched again up to the retries, as Spark's Kafka source does with "incorrect
        offsets" (a restarting broker), and returned as it is after them."""
        wanted = list(tps)
        if not wanted:
            return {}

        def lookup() -> PartitionOffsets:
            try:
                return list_offsets(
                    self.admin, wanted, spec, isolation=isolation, timeout_s=self._call_timeout_s
                )
            except IncompleteAnswerError:
                # A new client: it learns every leader afresh. After a leader's SIGKILL the
                # client that asked the dead node went on answering no offset for minutes,
                # through metadata refreshes, in a Spark driver under load (Kafka 4.4).
                self.close_clients()
                raise
            except KafkaException as exc:
                if _stale_metadata(exc):
                    self._refresh_metadata({topic for topic, _ in wanted})
                raise

        attempts = self.options.fetch_offset_retries + 1
        for attempt in range(attempts):
            found = self._retrying("listing offsets", lookup)
            behind = {tp: (known[tp], o) for tp, o in found.items() if o < (known or {}).get(tp, o)}
            if not behind or attempt + 1 == attempts:
                return found
            log.warning("offsets behind those read (read, listed): %s; fetching again", behind)
            time.sleep(self.options.fetch_offset_retry_interval_ms / 1000.0)
        raise AssertionError("unreachable")

    def _refresh_metadata(self, topics: Iterable[str]) -> None:
        """Ask for the topics' metadata, which updates the admin client's cached leaders."""
        for topic in topics:
            try:
                self.admin.list_topics(topic, timeout=self._call_timeout_s)
            except KafkaException as exc:
                log.debug("refreshing the metadata of %s: %s", topic, exc)

    def earliest(self, tps: Iterable[TopicPartitionKey]) -> PartitionOffsets:
        return self._list_offsets(tps, OffsetSpec.earliest(), IsolationLevel.READ_UNCOMMITTED)

    def latest(
        self, tps: Iterable[TopicPartitionKey], known: PartitionOffsets | None = None
    ) -> PartitionOffsets:
        """High watermarks, or last stable offsets when the source reads committed data;
        `known`: what the query has read (see _list_offsets)."""
        isolation = isolation_level(self.options.isolation_level == "read_committed")
        return self._list_offsets(tps, OffsetSpec.latest(), isolation, known)
