"""The last batch of each active producer: what the cleaner must keep, possibly emptied, so
that producer state (epoch, last sequence) rebuilt from the log after a restart and
DescribeProducers stay right (Kafka's UnifiedLog.lastRecordsOfActiveProducers)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from onceflow.log.producer_state import ProducerStateManager
from onceflow.records.batch import BatchHeader


@dataclass(frozen=True, slots=True)
class LastRecord:
    """Kafka's LastRecord: the producer's last data offset in its current epoch (None when it
    has none, e.g. the epoch was bumped by a marker) and its current epoch."""

    last_data_offset: int | None
    producer_epoch: int


def last_records_of_producers(headers: Iterable[BatchHeader]) -> dict[int, LastRecord]:
    """LastRecord of every producer id seen in `headers` (the whole log, in offset order),
    as Kafka's producer state keeps it: a batch of a new epoch forgets the older epoch's data.

    The broker can instead build this from its live producer state, which also drops expired
    producers (whose batches the cleaner may then remove entirely, as Kafka's does).
    """
    last: dict[int, LastRecord] = {}
    for header in headers:
        if not header.has_producer_id:
            continue
        previous = last.get(header.producer_id)
        data_offset = None
        if previous is not None and previous.producer_epoch == header.producer_epoch:
            data_offset = previous.last_data_offset
        if not header.is_control:
            data_offset = header.last_offset
        last[header.producer_id] = LastRecord(data_offset, header.producer_epoch)
    return last


def is_last_batch_of_producer(header: BatchHeader, last_records: Mapping[int, LastRecord]) -> bool:
    """Kafka's isBatchLastRecordOfProducer: the batch holding the producer's last data offset
    (it carries the last sequence), or, with no data in the current epoch, a marker of that
    epoch (it carries the epoch, needed for fencing)."""
    last = last_records.get(header.producer_id)
    if last is None:
        return False
    if last.last_data_offset is not None:
        return header.last_offset == last.last_data_offset
    return header.is_control and header.producer_epoch == last.producer_epoch


def last_records_from_state(state: ProducerStateManager) -> dict[int, LastRecord]:
    """LastRecord of every producer the partition's live producer state still tracks (expired
    producers are gone from it, so their batches may all be cleaned away, as in Kafka)."""
    last: dict[int, LastRecord] = {}
    for producer in state.producers():
        batches = state.batch_metadata(producer.producer_id)
        data_offset = batches[-1].last_offset if batches else None
        last[producer.producer_id] = LastRecord(data_offset, producer.producer_epoch)
    return last
