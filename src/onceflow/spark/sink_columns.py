"""The columns of Spark's Kafka sink (key, value, topic, partition, headers) and producing them.

Checked once on the driver against the query's schema, so that a bad column fails the query
before any task opens a transaction; tasks then turn Arrow batches into `produce()` calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
)

from onceflow.spark.options import OptionError

UNASSIGNED_PARTITION = -1
"""librdkafka's RD_KAFKA_PARTITION_UA: let the partitioner choose."""


def _is_header_array(data_type: DataType) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    fields = {f.name: f.dataType for f in data_type.elementType.fields}
    return (
        len(fields) == 2
        and isinstance(fields.get("key"), StringType)
        and isinstance(fields.get("value"), BinaryType)
    )


@dataclass(frozen=True)
class SinkColumns:
    """Positions of the sink's columns in the input; other columns are ignored (as Spark)."""

    value: int
    key: int | None = None
    topic: int | None = None
    partition: int | None = None
    headers: int | None = None

    @classmethod
    def from_schema(cls, schema: StructType, topic_option: str | None) -> SinkColumns:
        by_name = {f.name.lower(): (i, f.dataType) for i, f in enumerate(schema.fields)}

        def find(name: str, ok: Callable[[DataType], bool], wanted: str) -> int | None:
            if name not in by_name:
                return None
            index, data_type = by_name[name]
            if not ok(data_type):
                raise OptionError(
                    f"column {name!r} must be {wanted}, not {data_type.simpleString()}"
                )
            return index

        binary_or_string = (
            lambda t: isinstance(t, (BinaryType, StringType)),
            "binary or string",
        )
        value = find("value", *binary_or_string)
        if value is None:
            raise OptionError("the sink needs a 'value' column (binary or string)")
        topic = find("topic", lambda t: isinstance(t, StringType), "string")
        if topic is None and topic_option is None:
            raise OptionError("the sink needs the 'topic' option or a 'topic' column")
        return cls(
            value=value,
            key=find("key", *binary_or_string),
            # the 'topic' option overrides the column, as in Spark's Kafka sink
            topic=None if topic_option is not None else topic,
            partition=find("partition", lambda t: isinstance(t, IntegerType), "int"),
            headers=find("headers", _is_header_array, "array<struct<key: string, value: binary>>"),
        )

    def first_topic(self, batch: pa.RecordBatch, topic_option: str | None) -> str:
        """The topic of the batch's first row (where a task without a topic option marks done)."""
        if topic_option is not None:
            return topic_option
        assert self.topic is not None
        topic = batch.column(self.topic)[0].as_py()
        if topic is None:
            raise OptionError("a row has a null 'topic' and no 'topic' option is set")
        return topic


QUEUE_FULL_TIMEOUT_S = 120.0


class ProduceQueueFull(RuntimeError):
    """The producer's queue stayed full: the cluster is not taking records."""


def produce_batch(
    producer: Any, batch: pa.RecordBatch, columns: SinkColumns, topic_option: str | None
) -> int:
    """Hand every row of `batch` to `producer.produce`; returns the number of rows."""
    n = batch.num_rows
    if n == 0:
        return 0
    values = batch.column(columns.value).to_pylist()
    keys = batch.column(columns.key).to_pylist() if columns.key is not None else [None] * n
    produce = producer.produce
    simple = columns.topic is None and columns.partition is None and columns.headers is None
    if simple:
        topic = topic_option
        for key, value in zip(keys, values, strict=True):
            try:
                produce(topic, value, key)
            except BufferError:
                produce_when_room(producer, topic, value, key)
    else:
        topics = (
            batch.column(columns.topic).to_pylist()
            if columns.topic is not None
            else [topic_option] * n
        )
        partitions = (
            batch.column(columns.partition).to_pylist()
            if columns.partition is not None
            else [None] * n
        )
        headers = (
            batch.column(columns.headers).to_pylist() if columns.headers is not None else [None] * n
        )
        for i in range(n):
            topic = topics[i]
            if topic is None:
                raise OptionError("a row has a null 'topic' and no 'topic' option is set")
            part = partitions[i]
            row_headers = [(h["key"], h["value"]) for h in headers[i]] if headers[i] else None
            kwargs: dict[str, Any] = {"partition": UNASSIGNED_PARTITION if part is None else part}
            if row_headers:
                kwargs["headers"] = row_headers
            try:
                produce(topic, values[i], keys[i], **kwargs)
            except BufferError:
                produce_when_room(producer, topic, values[i], keys[i], **kwargs)
    producer.poll(0)
    return n


def produce_when_room(producer: Any, *args: Any, **kwargs: Any) -> None:
    """Retry a produce refused for a full local queue, serving deliveries meanwhile (bounded)."""
    deadline = time.monotonic() + QUEUE_FULL_TIMEOUT_S
    while True:
        producer.poll(0.05)
        try:
            producer.produce(*args, **kwargs)
            return
        except BufferError:
            if time.monotonic() > deadline:
                raise ProduceQueueFull(
                    f"the producer queue stayed full for {QUEUE_FULL_TIMEOUT_S:.0f} s"
                ) from None
