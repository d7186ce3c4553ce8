"""A partition as the broker serves it: its log (log/unified_log.py, the one replica, the leader)
and the append of a produced batch, verified with the transaction coordinator first.

As Kafka's ReplicaManager.appendRecords and Partition.appendRecordsToLeader: the log validates
the batch, the coordinator answers the questions about its producer (issued? whose? is this
partition in its transaction, KIP-890?), and the log appends with those answers in a
VerificationGuard. The order of the refusals is the log's validation first, then the
coordinator's, then the producer state's.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from onceflow.log.unified_log import UnifiedLog
from onceflow.log.verification_guard import VerificationGuard
from onceflow.records.batch import BatchHeader
from onceflow.records.decompression import DEFAULT_MAX_DECOMPRESSED_BYTES
from onceflow.records.validation import Appended, AppendRefused
from onceflow.txn.coordinator import TransactionCoordinator

# The broker's name for a partition's log: there is one replica, so nothing else to hold.
Partition = UnifiedLog


def append_records_to_leader(
    partition: UnifiedLog,
    records: bytes,
    transactional_id: str | None,
    transactions: TransactionCoordinator,
    *,
    produce_version: int = 0,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> Appended:
    """The exactly-once append of a produced batch. Raises AppendRefused with Kafka's error
    code; nothing is written then."""
    validated = partition.validate(records, max_decompressed_bytes=max_decompressed_bytes)
    [(_, header)] = validated.batches
    guard = None
    if header.has_producer_id:
        guard = verify(
            partition, header, transactional_id, transactions, produce_version=produce_version
        )
    return partition.append_as_leader(records, validated, guard)


def verify(
    partition: UnifiedLog,
    header: BatchHeader,
    transactional_id: str | None,
    transactions: TransactionCoordinator,
    *,
    produce_version: int,
) -> VerificationGuard:
    """The coordinator's answers for a batch with a producer id, before the log's checks.
    Raises AppendRefused for an id it never issued or one another transactional id owns."""
    if not transactions.was_issued(header.producer_id):
        # Made-up ids would each cost producer state for a day; clients reset their
        # producer id on UNKNOWN_PRODUCER_ID (INVALID_PRODUCER_ID_MAPPING is fatal to them).
        raise AppendRefused(
            ErrorCode.unknown_producer_id,
            f"producer id {header.producer_id} was never issued by this broker",
        )
    if header.is_transactional:
        _check_owner(header, transactional_id, transactions)
    verdict = ErrorCode.none
    if partition.needs_verification(header):
        # KIP-890: a transactional batch may only open a transaction on a partition that
        # the coordinator added to the producer's ongoing transaction.
        verdict = (
            transactions.is_in_transaction(
                transactional_id,
                header.producer_id,
                header.producer_epoch,
                partition.topic,
                partition.index,
                produce_version=produce_version,
            )
            if transactional_id
            else ErrorCode.invalid_txn_state
        )
    # (asked of idempotent batches only: a transactional one was checked against its owner)
    transactional_producer = (
        not header.is_transactional and transactions.owner_of(header.producer_id) is not None
    )
    return VerificationGuard(verdict, transactional_id, transactional_producer)


def _check_owner(
    header: BatchHeader, transactional_id: str | None, transactions: TransactionCoordinator
) -> None:
    """A transactional batch must name the transactional id that owns its producer id (the
    coordinator's durable mapping). Kafka asks the coordinator only when the batch would open
    a transaction on the partition (KIP-890); asked always, a batch forged under the id, epoch
    and next sequence of a producer (DescribeProducers shows them) cannot join its open
    transaction."""
    if transactional_id is None:
        raise AppendRefused(
            ErrorCode.transactional_id_authorization_failed,
            "transactional records need a transactional id",
        )
    owner = transactions.get(transactional_id)
    if owner is None or owner.producer_id != header.producer_id:
        raise AppendRefused(
            ErrorCode.invalid_producer_id_mapping,
            f"producer id {header.producer_id} is not the one of transactional id "
            f"{transactional_id!r}",
        )
