"""ListOffsets through librdkafka's AdminClient, with its one quirk handled in one place.

While a broker restarts, librdkafka may answer a partition's ListOffsets without an error and
without an offset: the offset is left at -1001 (RD_KAFKA_OFFSET_INVALID). Read as an offset, it
makes a partition look empty, or a source look caught up before the end of its input. Here
such an answer is an :class:`IncompleteAnswerError`, which the callers retry.
"""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec


class IncompleteAnswerError(RuntimeError):
    """A ListOffsets answer without an offset for some partition and without an error."""


def isolation_level(read_committed: bool) -> IsolationLevel:
    return IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED


def list_offsets(
    admin: AdminClient,
    partitions: Iterable[tuple[str, int]],
    spec: OffsetSpec,
    *,
    isolation: IsolationLevel,
    timeout_s: float,
) -> dict[tuple[str, int], int]:
    """{(topic, partition): offset} for `spec` (earliest or latest); a failed partition raises
    its KafkaException, a partition answered without an offset IncompleteAnswerError."""
    futures = admin.list_offsets(
        {TopicPartition(t, p): spec for t, p in partitions},
        isolation_level=isolation,
        request_timeout=timeout_s,
    )
    found = {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
    unset = sorted(tp for tp, offset in found.items() if offset < 0)
    if unset:
        raise IncompleteAnswerError(f"no offset in the answer for {unset}")
    return found
