"""The plain sink (exactlyOnce=false): produce and flush, as Spark's own Kafka sink does.

Records handed to the producer are delivered even when the task then fails, so a retried task,
or a re-run batch, writes them again: at-least-once. Kept to show what that costs.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
from confluent_kafka import KafkaError, Producer

from onceflow.spark.sink_columns import produce_batch
from onceflow.spark.sink_target import SinkTarget, TaskOutcome


class DeliveryError(RuntimeError):
    """Records could not be delivered (the task fails and Spark retries it)."""


# Producers kept per Python worker process and reused by its tasks, as Spark's Kafka sink does;
# each with the list its delivery callback fills with failures.
_producers: dict[tuple[tuple[str, str], ...], tuple[Producer, list[KafkaError]]] = {}


def _key(target: SinkTarget) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in target.producer_config().items()))


def _producer(target: SinkTarget) -> tuple[Producer, list[KafkaError]]:
    key = _key(target)
    if key not in _producers:
        errors: list[KafkaError] = []

        def on_delivery(error: KafkaError | None, _message: object) -> None:
            if error is not None:
                errors.append(error)

        producer = Producer(
            target.producer_config(
                **{"on_delivery": on_delivery, "delivery.report.only.error": True, "acks": "all"}
            )
        )
        _producers[key] = (producer, errors)
    return _producers[key]


def write_at_least_once(
    target: SinkTarget,
    partition: int,
    attempt: int,
    batch_id: int,
    batches: Iterable[pa.RecordBatch],
) -> TaskOutcome:
    producer, errors = _producer(target)
    errors.clear()
    rows = 0
    try:
        for batch in batches:
            rows += produce_batch(producer, batch, target.columns, target.topic)
    finally:
        # even when the task fails: what was produced goes out (no way to take it back)
        undelivered = producer.flush(target.timeout_s)
        if undelivered:
            _producers.pop(_key(target), None)
    if undelivered or errors:
        raise DeliveryError(
            f"{undelivered} records undelivered after {target.timeout_s:.0f} s, "
            f"{len(errors)} failed" + (f" (first: {errors[0]})" if errors else "")
        )
    return TaskOutcome(batch_id=batch_id, partition=partition, attempt=attempt, rows=rows)


def close_producers(timeout_s: float = 10.0) -> None:
    """Flush and drop the cached producers of this process."""
    producers = [producer for producer, _ in _producers.values()]
    _producers.clear()
    for producer in producers:
        producer.flush(timeout_s)
