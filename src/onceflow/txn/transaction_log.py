"""Record format of the ``__transaction_state`` log, following Apache Kafka's.

Key: int16 version, then
  - version 0, TransactionLogKey: transactional id (int16-length UTF-8 string), as Kafka;
  - version ``PRODUCER_ID_BLOCK_KEY_VERSION``, onceflow's producer id block key: nothing more.
    Kafka keeps producer id blocks in its metadata log; onceflow keeps them here so that a
    single log makes the coordinator durable. Kafka's loader skips keys of unknown versions.
Value of a TransactionLogKey: int16 version, then Kafka's TransactionLogValue
  - v0: producer id int64, epoch int16, timeout int32, state int8, partitions (nullable array of
    topic string + int32 array), last update timestamp int64, start timestamp int64;
  - v1 (flexible, written by onceflow): the same fields with compact strings/arrays, then tagged
    fields: 0 = previous producer id, 1 = next producer id, 2 = client transaction version, and
    onceflow's ``LAST_PRODUCER_EPOCH_TAG`` = last producer epoch (KIP-360 retries after a
    restart; Kafka does not persist it and ignores the unknown tag).
  A value of None is a tombstone: the transactional id expired (Dead).
Value of the producer id block key: int16 version 0, first producer id int64, block size int32.
"""

from __future__ import annotations

from dataclasses import dataclass

from onceflow.coordinator.result import TopicPartition
from onceflow.coordinator.schema import (
    INT8,
    INT16,
    INT32,
    INT64,
    SchemaReader,
    encode_compact_string,
    encode_string,
    encode_tagged_field,
    encode_uvarint,
)
from onceflow.txn.coordinator_errors import TransactionLogRecordError
from onceflow.txn.transaction_state import TransactionState

TRANSACTION_LOG_KEY_VERSION = 0
TRANSACTION_LOG_VALUE_VERSION = 1
# Far from Kafka's key versions so a future Kafka key version cannot collide with it.
PRODUCER_ID_BLOCK_KEY_VERSION = 0x4F46
PRODUCER_ID_BLOCK_VALUE_VERSION = 0

PREVIOUS_PRODUCER_ID_TAG = 0
NEXT_PRODUCER_ID_TAG = 1
CLIENT_TRANSACTION_VERSION_TAG = 2
# Far above Kafka's tags, for the same reason as the block key version.
LAST_PRODUCER_EPOCH_TAG = 0x4F46

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1


@dataclass(frozen=True)
class TransactionLogValue:
    """Everything the coordinator knows about one transactional id (Kafka's TransactionLogValue
    plus the last producer epoch)."""

    producer_id: int
    producer_epoch: int
    txn_timeout_ms: int
    state: TransactionState
    partitions: frozenset[TopicPartition]
    txn_last_update_timestamp: int
    txn_start_timestamp: int
    # The producer id before the last InitProducerId, and the epoch a retried InitProducerId
    # may still present (KIP-360); -1 when there is none.
    previous_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    # Transactions version 2 (KIP-890): the producer id the transaction moves to once its
    # markers are written (the epoch bump at EndTxn exhausted the epochs), and the version of
    # the client that last changed the transaction (2 bumps the epoch at every end).
    next_producer_id: int = NO_PRODUCER_ID
    client_transaction_version: int = 0


@dataclass(frozen=True)
class ProducerIdBlock:
    """Producer ids [first_producer_id, first_producer_id + size) reserved for this broker."""

    first_producer_id: int
    size: int

    @property
    def end(self) -> int:
        """The first producer id after the block."""
        return self.first_producer_id + self.size


@dataclass(frozen=True)
class TransactionLogKey:
    transactional_id: str


@dataclass(frozen=True)
class ProducerIdBlockKey:
    pass


LogKey = TransactionLogKey | ProducerIdBlockKey


# -- encoding -------------------------------------------------------------------------------


def _string(s: str) -> bytes:
    return encode_string(s, TransactionLogRecordError)


def encode_key(transactional_id: str) -> bytes:
    return INT16.pack(TRANSACTION_LOG_KEY_VERSION) + _string(transactional_id)


def encode_value(value: TransactionLogValue) -> bytes:
    if value.state is TransactionState.DEAD:
        raise TransactionLogRecordError("Dead is written as a tombstone, not as a value")
    if value.state is TransactionState.EMPTY and value.partitions:
        raise TransactionLogRecordError("an Empty transaction has no partitions")
    out = bytearray(INT16.pack(TRANSACTION_LOG_VALUE_VERSION))
    out += INT64.pack(value.producer_id)
    out += INT16.pack(value.producer_epoch)
    out += INT32.pack(value.txn_timeout_ms)
    out += INT8.pack(int(value.state))
    if value.state is TransactionState.EMPTY:
        out += encode_uvarint(0)  # null, as Kafka writes for Empty
    else:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in value.partitions:
            by_topic.setdefault(topic, []).append(partition)
        out += encode_uvarint(len(by_topic) + 1)
        for topic in sorted(by_topic):
            partitions = sorted(by_topic[topic])
            out += encode_compact_string(topic)
            out += encode_uvarint(len(partitions) + 1)
            out += b"".join(INT32.pack(p) for p in partitions)
            out += encode_uvarint(0)  # no tagged fields
    out += INT64.pack(value.txn_last_update_timestamp)
    out += INT64.pack(value.txn_start_timestamp)
    tagged = []
    if value.previous_producer_id != NO_PRODUCER_ID:
        tagged.append(
            encode_tagged_field(PREVIOUS_PRODUCER_ID_TAG, INT64.pack(value.previous_producer_id))
        )
    if value.next_producer_id != NO_PRODUCER_ID:
        tagged.append(encode_tagged_field(NEXT_PRODUCER_ID_TAG, INT64.pack(value.next_producer_id)))
    if value.client_transaction_version != 0:
        tagged.append(
            encode_tagged_field(
                CLIENT_TRANSACTION_VERSION_TAG, INT16.pack(value.client_transaction_version)
            )
        )
    if value.last_producer_epoch != NO_PRODUCER_EPOCH:
        tagged.append(
            encode_tagged_field(LAST_PRODUCER_EPOCH_TAG, INT16.pack(value.last_producer_epoch))
        )
    out += encode_uvarint(len(tagged))
    for field in tagged:
        out += field
    return bytes(out)


def encode_producer_id_block_key() -> bytes:
    return INT16.pack(PRODUCER_ID_BLOCK_KEY_VERSION)


def encode_producer_id_block_value(block: ProducerIdBlock) -> bytes:
    return (
        INT16.pack(PRODUCER_ID_BLOCK_VALUE_VERSION)
        + INT64.pack(block.first_producer_id)
        + INT32.pack(block.size)
    )


def transaction_record(
    transactional_id: str, value: TransactionLogValue | None
) -> tuple[bytes, bytes | None]:
    """The (key, value) record of a transactional id; None writes a tombstone."""
    return encode_key(transactional_id), None if value is None else encode_value(value)


def producer_id_block_record(block: ProducerIdBlock) -> tuple[bytes, bytes]:
    return encode_producer_id_block_key(), encode_producer_id_block_value(block)


# -- decoding -------------------------------------------------------------------------------


def _reader(buf: bytes) -> SchemaReader:
    """A cursor whose every fault is this log's typed error."""
    return SchemaReader(buf, TransactionLogRecordError)


def decode_key(key: bytes) -> LogKey:
    r = _reader(key)
    version = r.unpack(INT16)
    if version == TRANSACTION_LOG_KEY_VERSION:
        parsed: LogKey = TransactionLogKey(r.string())
    elif version == PRODUCER_ID_BLOCK_KEY_VERSION:
        parsed = ProducerIdBlockKey()
    else:
        raise TransactionLogRecordError(f"unknown transaction log key version {version}")
    r.end()
    return parsed


def decode_value(value: bytes) -> TransactionLogValue:
    r = _reader(value)
    version = r.unpack(INT16)
    if version not in (0, 1):
        raise TransactionLogRecordError(f"unknown transaction log value version {version}")
    flexible = version >= 1
    producer_id = r.unpack(INT64)
    producer_epoch = r.unpack(INT16)
    timeout = r.unpack(INT32)
    state_id = r.unpack(INT8)
    try:
        state = TransactionState(state_id)
    except ValueError as exc:
        raise TransactionLogRecordError(f"unknown transaction state id {state_id}") from exc
    count = r.uvarint() - 1 if flexible else r.unpack(INT32)
    partitions: set[TopicPartition] = set()
    for _ in range(max(count, 0)):
        topic = r.compact_string() if flexible else r.string()
        n = r.uvarint() - 1 if flexible else r.unpack(INT32)
        if n < 0:
            raise TransactionLogRecordError("null partition array")
        for _ in range(n):
            partitions.add((topic, r.unpack(INT32)))
        if flexible:
            r.tagged_fields()
    last_update = r.unpack(INT64)
    start = r.unpack(INT64)
    previous_producer_id = NO_PRODUCER_ID
    last_producer_epoch = NO_PRODUCER_EPOCH
    next_producer_id = NO_PRODUCER_ID
    client_transaction_version = 0
    if flexible:
        tagged = r.tagged_fields()
        if PREVIOUS_PRODUCER_ID_TAG in tagged:
            previous_producer_id = INT64.unpack(_exact(tagged[PREVIOUS_PRODUCER_ID_TAG], 8))[0]
        if NEXT_PRODUCER_ID_TAG in tagged:
            next_producer_id = INT64.unpack(_exact(tagged[NEXT_PRODUCER_ID_TAG], 8))[0]
        if CLIENT_TRANSACTION_VERSION_TAG in tagged:
            client_transaction_version = INT16.unpack(
                _exact(tagged[CLIENT_TRANSACTION_VERSION_TAG], 2)
            )[0]
        if LAST_PRODUCER_EPOCH_TAG in tagged:
            last_producer_epoch = INT16.unpack(_exact(tagged[LAST_PRODUCER_EPOCH_TAG], 2))[0]
    r.end()
    # As Kafka's loader: an Empty transaction has no partitions, whatever was written.
    if state is TransactionState.EMPTY:
        partitions.clear()
    return TransactionLogValue(
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        txn_timeout_ms=timeout,
        state=state,
        partitions=frozenset(partitions),
        txn_last_update_timestamp=last_update,
        txn_start_timestamp=start,
        previous_producer_id=previous_producer_id,
        last_producer_epoch=last_producer_epoch,
        next_producer_id=next_producer_id,
        client_transaction_version=client_transaction_version,
    )


def _exact(data: bytes, size: int) -> bytes:
    if len(data) != size:
        raise TransactionLogRecordError(f"tagged field of {len(data)} bytes, expected {size}")
    return data


def decode_producer_id_block_value(value: bytes) -> ProducerIdBlock:
    r = _reader(value)
    version = r.unpack(INT16)
    if version != PRODUCER_ID_BLOCK_VALUE_VERSION:
        raise TransactionLogRecordError(f"unknown producer id block value version {version}")
    block = ProducerIdBlock(first_producer_id=r.unpack(INT64), size=r.unpack(INT32))
    r.end()
    if block.first_producer_id < 0 or block.size <= 0:
        raise TransactionLogRecordError(f"invalid producer id block {block}")
    return block
