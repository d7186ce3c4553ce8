"""The columns of Spark's Kafka source, and Arrow batches of them built from consumed records."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

HEADER_TYPE = StructType([StructField("key", StringType()), StructField("value", BinaryType())])

_BASE_FIELDS = [
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
]


def source_schema(include_headers: bool) -> StructType:
    """Spark's Kafka source schema; `headers` only with includeHeaders=true, as in Spark."""
    fields = list(_BASE_FIELDS)
    if include_headers:
        fields.append(StructField("headers", ArrayType(HEADER_TYPE)))
    return StructType(fields)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects back from `read()` (it checks equality, not castability)."""
    return to_arrow_schema(schema, timezone="UTC")


# confluent-kafka timestamp types (0 none, 1 create, 2 log append) to Kafka's ids (-1, 0, 1)
_TIMESTAMP_TYPE = {0: -1, 1: 0, 2: 1}


class RecordColumns:
    """Accumulates consumed records of one topic partition and emits Arrow record batches."""

    def __init__(self, schema: pa.Schema, topic: str, partition: int) -> None:
        self.schema = schema
        self.topic = topic
        self.partition = partition
        self.include_headers = "headers" in schema.names
        self._clear()

    def _clear(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.timestamp_types: list[int] = []
        self.headers: list[list[dict[str, Any]] | None] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, message: Any) -> None:
        """Add one confluent_kafka.Message (not an error event)."""
        self.extend([message])

    def extend(self, messages: list[Any]) -> None:
        """Add consumed messages (no error events), a column at a time: one pass per field is
        markedly faster in Python than one call per message."""
        self.keys += [m.key() for m in messages]
        self.values += [m.value() for m in messages]
        self.offsets += [m.offset() for m in messages]
        stamps = [m.timestamp() for m in messages]
        self.timestamp_types += [_TIMESTAMP_TYPE.get(t, -1) for t, _ in stamps]
        self.timestamps += [ts for _, ts in stamps]
        if self.include_headers:
            self.headers += [
                [{"key": k, "value": v} for k, v in raw] if (raw := m.headers()) else None
                for m in messages
            ]

    def take(self) -> pa.RecordBatch:
        """The accumulated records as one batch in the schema's exact types; then start over."""
        n = len(self.offsets)
        schema = self.schema
        micros = pc.multiply(pa.array(self.timestamps, pa.int64()), 1000)
        arrays = [
            pa.array(self.keys, schema.field("key").type),
            pa.array(self.values, schema.field("value").type),
            pa.array([self.topic] * n, schema.field("topic").type),
            pa.array([self.partition] * n, schema.field("partition").type),
            pa.array(self.offsets, schema.field("offset").type),
            micros.cast(schema.field("timestamp").type),
            pa.array(self.timestamp_types, schema.field("timestampType").type),
        ]
        if self.include_headers:
            arrays.append(pa.array(self.headers, schema.field("headers").type))
        self._clear()
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
