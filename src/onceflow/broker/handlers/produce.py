"""Produce (0): validate batches, append them as sent, acknowledge per `acks`.

Every record of every batch is walked before the append (records/validation.py), compressed
batches as a stream of at most `message.max.decompressed.bytes` decompressed bytes, so nothing
undecodable, and no decompression bomb, is ever stored.

acks=-1 answers only after the appended bytes are fsynced (group commit); acks=0/1 answer at
once, and their data is made durable by the next round of fsyncs, which also moves the high
watermark (so readers only ever see durable data).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.dispatch import api
from onceflow.broker.durability import PartitionsNotDurableError
from onceflow.broker.faults import crash_point, delay_point
from onceflow.broker.keyless_records import keyless_message, null_key_indexes, refusal_message
from onceflow.log.errors import DescriptorsExhaustedError
from onceflow.protocol.entities import build, has_field, sibling
from onceflow.protocol.messages import response_type
from onceflow.records.decompression import DEFAULT_MAX_DECOMPRESSED_BYTES
from onceflow.records.errors import (
    CorruptRecordError,
    InvalidRecordError,
    RecordsError,
    RecordTooLargeError,
    UnsupportedCompressionError,
    UnsupportedMagicError,
)
from onceflow.records.validation import validate_produce_records
from onceflow.txn.errors import TxnError

if TYPE_CHECKING:
    from onceflow.broker.partition import Partition
    from onceflow.broker.server import Broker
    from onceflow.protocol.messages import Request

log = logging.getLogger(__name__)

_RECORDS_ERRORS: list[tuple[type[RecordsError], ErrorCode]] = [
    (UnsupportedMagicError, ErrorCode.unsupported_for_message_format),
    (UnsupportedCompressionError, ErrorCode.unsupported_compression_type),
    (InvalidRecordError, ErrorCode.invalid_record),
    # Kafka's RecordTooLargeException; on it Java and librdkafka producers split the batch
    (RecordTooLargeError, ErrorCode.message_too_large),
    (CorruptRecordError, ErrorCode.corrupt_message),
]


def records_error_code(error: RecordsError) -> ErrorCode:
    for kind, code in _RECORDS_ERRORS:
        if isinstance(error, kind):
            return code
    return ErrorCode.corrupt_message


class ProduceError(Exception):
    def __init__(
        self, code: ErrorCode, message: str, record_errors: list[tuple[int, str]] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        # (batch index, message) of the records at fault: Produce v8+'s record_errors
        self.record_errors = record_errors or []


def to_datetime(ms: int) -> datetime.datetime | None:
    if ms < 0:
        return None
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


@dataclass(frozen=True, slots=True)
class Appended:
    first_offset: int
    log_append_time: int
    log_start_offset: int


def append_to_partition(
    broker: Broker,
    partition: Partition,
    records: bytes,
    transactional_id: str | None,
    produce_version: int = 0,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> Appended:
    """Validate, run the idempotence/transaction checks, append; raises ProduceError."""
    config = partition.log.config
    try:
        # max.message.bytes is checked on the header, before any record is walked
        validated = validate_produce_records(
            records,
            max_batch_size=config.max_message_bytes,
            max_decompressed_bytes=max_decompressed_bytes,
        )
    except RecordsError as e:
        raise ProduceError(records_error_code(e), str(e)) from None
    headers = validated.batches
    [(position, header)] = headers  # validation allows exactly one batch (Produce v3+)
    if config.compact and validated.null_keys:
        # LogValidator.validateKey, before the size and producer-state checks, as in Kafka
        message = keyless_message(partition.topic, partition.index)
        indexes = null_key_indexes(
            records, position, header, max_decompressed_bytes=max_decompressed_bytes
        )
        errors = [(index, message) for index in indexes]
        raise ProduceError(
            ErrorCode.invalid_record, refusal_message(validated.null_keys, errors), errors
        )
    if header.size > config.segment_bytes:  # as Kafka: a batch never spans segments
        raise ProduceError(
            ErrorCode.record_list_too_large,
            f"batch of {header.size} bytes exceeds segment.bytes={config.segment_bytes}",
        )
    if header.has_producer_id:
        if not broker.transactions.coordinator.was_issued(header.producer_id):
            # Made-up ids would each cost producer state for a day; clients reset their
            # producer id on UNKNOWN_PRODUCER_ID (INVALID_PRODUCER_ID_MAPPING is fatal to them).
            raise ProduceError(
                ErrorCode.unknown_producer_id,
                f"producer id {header.producer_id} was never issued by this broker",
            )
        verified = True
        if partition.producers.needs_verification(header):
            # KIP-890: a transactional batch may only open a transaction on a partition that
            # the coordinator added to the producer's ongoing transaction.
            verified = broker.transactions.verify_partition(
                transactional_id,
                header.producer_id,
                header.producer_epoch,
                partition.topic,
                partition.index,
            )
        try:
            duplicate = partition.producers.check_append(header, transaction_verified=verified)
        except TxnError as e:
            code = e.error_code
            if not verified and code == ErrorCode.invalid_txn_state and transactional_id:
                # Answer the coordinator's verdict as Kafka maps it for Produce: a fenced
                # producer expects INVALID_PRODUCER_EPOCH, a completing transaction a retry.
                verdict = broker.transactions.coordinator.is_in_transaction(
                    transactional_id,
                    header.producer_id,
                    header.producer_epoch,
                    partition.topic,
                    partition.index,
                    produce_version=produce_version,
                )
                code = verdict if verdict != ErrorCode.none else code
            raise ProduceError(code, str(e)) from None
        if duplicate is not None:
            return Appended(duplicate.first_offset, -1, partition.log.log_start_offset)
    try:
        info = partition.log.append(records, headers)
    except DescriptorsExhaustedError as e:
        # Nothing was written; Kafka's clients retry KAFKA_STORAGE_ERROR.
        raise ProduceError(ErrorCode.kafka_storage_error, str(e)) from None
    partition.after_append([h for _, h in info.headers])
    return Appended(info.first_offset, info.log_append_time, info.log_start_offset)


@api(0, 0, 12, parsed_from=3)
def handle_produce(broker: Broker, request: Request) -> Any:
    req = request.body
    cls = response_type(0, request.api_version)
    topic_cls = sibling(cls, "TopicProduceResponse")
    part_cls = sibling(cls, "PartitionProduceResponse")
    # Produce v8+ names the records at fault (KIP-467)
    record_error_cls = (
        sibling(cls, "BatchIndexAndErrorMessage") if has_field(part_cls, "record_errors") else None
    )
    if req.acks not in (0, 1, -1):
        error_all: ErrorCode | None = ErrorCode.invalid_required_acks
    else:
        error_all = None
    touched: list[Partition] = []
    topics_out = []
    for topic_data in req.topic_data:
        parts_out = []
        for pdata in topic_data.partition_data:
            partition = broker.topics.partition(topic_data.name, pdata.index)
            base_offset, append_time, start = -1, -1, -1
            error, message = ErrorCode.none, None
            record_errors: tuple[Any, ...] = ()
            if error_all is not None:
                error = error_all
            elif partition is None:
                error = ErrorCode.unknown_topic_or_partition
            elif not pdata.records:
                error, message = ErrorCode.invalid_record, "no records"
            else:
                try:
                    result = append_to_partition(
                        broker,
                        partition,
                        pdata.records,
                        req.transactional_id,
                        request.api_version,
                        broker.config.message_max_decompressed_bytes,
                    )
                except ProduceError as e:
                    error, message = e.code, str(e)
                    if record_error_cls is not None:
                        record_errors = tuple(
                            build(
                                record_error_cls,
                                batch_index=index,
                                batch_index_error_message=text,
                            )
                            for index, text in e.record_errors
                        )
                    log.info("produce to %s-%d refused: %s", topic_data.name, pdata.index, e)
                else:
                    base_offset, append_time = result.first_offset, result.log_append_time
                    start = result.log_start_offset
                    # A duplicate is answered once its original is durable, like any write.
                    touched.append(partition)
            parts_out.append(
                build(
                    part_cls,
                    index=pdata.index,
                    error_code=error,
                    base_offset=base_offset,
                    log_append_time=to_datetime(append_time),
                    log_start_offset=start,
                    record_errors=record_errors,
                    error_message=message,
                )
            )
        topics_out.append(
            build(topic_cls, name=topic_data.name, partition_responses=tuple(parts_out))
        )
    response = build(cls, responses=tuple(topics_out), throttle_time=datetime.timedelta(0))
    durable = broker.make_durable(touched)
    if req.acks == -1 and touched:
        return _after(durable, response)
    return None if req.acks == 0 else response


async def _after(durable: asyncio.Future[None], response: Any) -> Any:
    try:
        await durable
    except PartitionsNotDurableError as e:
        # Those partitions answer their error (deleted, or not yet synced); the others stand.
        response = _with_errors(response, e.errors)
    crash_point("produce.before-response")
    await delay_point("produce.before-response")
    return response


def _with_errors(response: Any, errors: dict[tuple[str, int], ErrorCode]) -> Any:
    def part(topic: str, p: Any) -> Any:
        code = errors.get((topic, p.index))
        if code is None:
            return p
        return dataclasses.replace(
            p, error_code=code, base_offset=-1, log_append_time=None, log_start_offset=-1
        )

    topics = tuple(
        dataclasses.replace(
            t, partition_responses=tuple(part(t.name, p) for p in t.partition_responses)
        )
        for t in response.responses
    )
    return dataclasses.replace(response, responses=topics)
