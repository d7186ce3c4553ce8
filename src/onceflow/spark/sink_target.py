"""What every write task of a sink needs (pickled to executors), and what it reports back."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import WriterCommitMessage

from onceflow.spark.sink_columns import SinkColumns

# Settings that only a producer understands: kept away from the done-mark consumer, which would
# log a warning for each.
_PRODUCER_ONLY = frozenset(
    {
        "acks",
        "batch.num.messages",
        "batch.size",
        "compression.codec",
        "compression.type",
        "compression.level",
        "delivery.timeout.ms",
        "enable.idempotence",
        "linger.ms",
        "message.send.max.retries",
        "message.timeout.ms",
        "partitioner",
        "queue.buffering.max.kbytes",
        "queue.buffering.max.messages",
        "queue.buffering.max.ms",
        "request.timeout.ms",
        "retries",
        "transaction.timeout.ms",
    }
)


# Task clients live for one task: connect to the brokers learned from metadata at once rather
# than after librdkafka's default 100 ms backoff (capped lower too, for short broker outages).
_QUICK_CONNECT = {"reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 1000}


def producer_config(client: dict[str, str], **overrides: object) -> dict[str, object]:
    """A task's producer for the cluster of `client` (the sinks' and the mirror's)."""
    return {
        # Java's default partitioner: keyed rows land where a Java producer puts them
        "partitioner": "murmur2_random",
        "linger.ms": 5,
        **_QUICK_CONNECT,
        **client,
        **overrides,
    }


def consumer_config(client: dict[str, str], **overrides: object) -> dict[str, object]:
    """A task's consumer of committed offsets for the cluster of `client`; never commits."""
    base = {k: v for k, v in client.items() if k not in _PRODUCER_ONLY}
    return {
        **_QUICK_CONNECT,
        **base,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        **overrides,
    }


@dataclass(frozen=True)
class SinkTarget:
    """Cluster, topic and columns of a sink, decided on the driver."""

    client: dict[str, str]
    topic: str | None
    columns: SinkColumns
    exactly_once: bool = True
    timeout_s: float = 60.0

    def producer_config(self, **overrides: object) -> dict[str, object]:
        return producer_config(self.client, **overrides)

    def consumer_config(self, **overrides: object) -> dict[str, object]:
        return consumer_config(self.client, **overrides)


@dataclass(frozen=True)
class TaskOutcome(WriterCommitMessage):
    """What one write task did; Spark pickles it to the driver's commit()."""

    batch_id: int
    partition: int
    attempt: int
    rows: int
    """Rows this attempt wrote (and, exactly-once, committed)."""
    rows_already_committed: int = 0
    """Rows of this (batch, partition) that earlier attempts had committed: skipped."""
    transactional_id: str | None = None
