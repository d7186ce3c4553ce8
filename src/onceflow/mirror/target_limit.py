"""The largest record batch a target topic takes (its max.message.bytes), and the mirror's
records held to it.

Each mirror transaction asks the target once (DescribeConfigs, by an admin client kept per
worker process), then sizes its producer to the topic: librdkafka never splits a batch the
broker refuses as too large (Java's producer does), so without a cap its batches of small
records fail on a topic with a small max.message.bytes. A record too large even alone in a
batch is named before anything is sent: RecordTooLargeError, one line with the source topic,
partition, offset and the limit, which the mirror's driver prints as its error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from onceflow.librdkafka_log import QUIET
from onceflow.records.batch import HEADER_SIZE
from onceflow.records.builder import build_batch

log = logging.getLogger(__name__)

# librdkafka's defaults of the two producer settings sized here
DEFAULT_BATCH_SIZE = 1_000_000
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
# Most bytes a v2 record adds to its key, value and headers (Kafka's DefaultRecord: the
# length, attributes, timestamp and offset deltas, key and value lengths, header count)...
_RECORD_OVERHEAD_MAX = 5 + 1 + 10 + 5 + 5 + 5 + 5
_HEADER_OVERHEAD_MAX = 5 + 5  # ...and each header (its key's and value's lengths)
_FIXED = HEADER_SIZE + _RECORD_OVERHEAD_MAX


class RecordTooLargeError(RuntimeError):
    """A source record larger than the target topic takes: the mirror cannot go on past it.
    Its message is the one line the mirror's driver prints."""


def record_too_large(
    source_topic: str, partition: int, offset: int, size: int, taker: str, limit: str
) -> RecordTooLargeError:
    """`taker` is who refuses it ("orders on the target", "the mirror's producer")."""
    return RecordTooLargeError(
        f"the record at offset {offset} of {source_topic}/{partition} is {size} bytes, more "
        f"than {taker} takes ({limit}); raise that, then restart the mirror"
    )


_lock = threading.Lock()
_admins: dict[tuple[tuple[str, str], ...], AdminClient] = {}
_unknown: set[str] = set()  # topics whose limit could not be read (said once)


def _admin(client: dict[str, str]) -> AdminClient:
    key = tuple(sorted(client.items()))
    with _lock:
        if key not in _admins:
            _admins[key] = AdminClient({**client, "logger": QUIET})
        return _admins[key]


def close_admins() -> None:
    """Forget the kept admin clients (tests between brokers; they close when collected)."""
    with _lock:
        _admins.clear()
        _unknown.clear()


def max_message_bytes(client: dict[str, str], topic: str, timeout_s: float) -> int | None:
    """The topic's max.message.bytes on the target (its own or the broker's default); None
    when it cannot be read (no DescribeConfigs permission, say): the producer is left as
    configured and the broker still refuses what is too large."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        future = _admin(client).describe_configs([resource], request_timeout=timeout_s)[resource]
        entry = future.result(timeout=timeout_s).get("max.message.bytes")
    except KafkaException as exc:
        with _lock:  # once per topic and process: every transaction would say it again
            first = topic not in _unknown
            _unknown.add(topic)
        if first:
            log.warning("%s: max.message.bytes unknown (%s); batches not sized to it", topic, exc)
        return None
    return int(entry.value) if entry is not None and entry.value else None


def sized_to(limit: int | None, config: dict[str, object]) -> dict[str, object]:
    """`config`'s batch.size and message.max.bytes for a topic taking batches of `limit` bytes:
    a batch at most the limit (librdkafka adds the batch header to batch.size), and every
    record the topic takes accepted by the producer (its own check is on the record alone)."""
    if limit is None:
        return {}
    batch = int(str(config.get("batch.size", DEFAULT_BATCH_SIZE)))
    most = int(str(config.get("message.max.bytes", DEFAULT_MESSAGE_MAX_BYTES)))
    return {
        "batch.size": max(1, min(batch, limit - HEADER_SIZE)),
        "message.max.bytes": max(most, limit),
    }


def _lengths(values: pa.Array) -> pa.Array:
    """Bytes of each binary or string value (0 for null)."""
    return pc.binary_length(values).fill_null(0).cast(pa.int64())


def _header_overheads(batch: pa.RecordBatch) -> list[int]:
    """Per row: the bytes of its headers' keys and values, plus their most overhead."""
    if (
        "headers" not in batch.schema.names
        or not pc.sum(pc.list_value_length(batch.column("headers")).fill_null(0)).as_py()
    ):
        return [0] * batch.num_rows
    return [
        sum(len(h["key"].encode()) + len(h["value"] or b"") + _HEADER_OVERHEAD_MAX for h in row)
        if row
        else 0
        for row in batch.column("headers").to_pylist()
    ]


def single_record_batch_bytes(
    key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes | None]]
) -> int:
    """The size of a batch holding this record alone: the least it can be sent as, and what
    the broker holds to max.message.bytes (uncompressed)."""
    return len(build_batch([(key, value, list(headers), 0)]))


def first_too_large(
    batch: pa.RecordBatch, limit: int | None, start: int = 0, stop: int | None = None
) -> tuple[int, int] | None:
    """(row, its size as a batch of its own) of the first row of [start, stop) that a topic
    taking batches of `limit` bytes cannot take at all; None if every row fits. Bounds for
    all rows at once first; exact sizes only for rows near the limit."""
    stop = batch.num_rows if stop is None else stop
    if limit is None or stop <= start:
        return None
    rows = batch.slice(start, stop - start)
    most = pc.add(pc.add(_lengths(rows.column("key")), _lengths(rows.column("value"))), _FIXED)
    header_bytes = _header_overheads(rows)
    if pc.max(most).as_py() + max(header_bytes) <= limit:
        return None  # the usual case: no row near the limit, decided without a loop over rows
    for i, bound in enumerate(most.to_pylist()):
        if bound + header_bytes[i] <= limit:
            continue
        row = rows.slice(i, 1).to_pylist()[0]
        headers = [(h["key"], h["value"]) for h in row.get("headers") or ()]
        size = single_record_batch_bytes(row["key"], row["value"], headers)
        if size > limit:
            return start + i, size
    return None
