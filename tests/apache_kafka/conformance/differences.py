"""The differences the conformance suite keeps: steps where onceflow answers otherwise than
Apache Kafka on purpose, each with its reason (README, "Conformance with Apache Kafka").

A kept difference must still be one: the suite fails when a listed step agrees, so the table
cannot outlive what it describes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KeptDifference:
    scenario: str
    steps: tuple[str, ...]
    reason: str


KEPT: tuple[KeptDifference, ...] = (
    KeptDifference(
        "duplicates_and_out_of_order_sequences",
        ("a cached sequence with other records",),
        "A batch that repeats a cached batch's sequences with other records: Kafka answers it "
        "as a duplicate (the records are nowhere), onceflow compares the cached batch's CRC and "
        "refuses it with OUT_OF_ORDER_SEQUENCE_NUMBER (README, the librdkafka sequence reuse).",
    ),
    KeptDifference(
        "transactional_requests_out_of_order",
        ("records without the transactional id", "the log"),
        "A non-transactional batch under the producer id of a transactional producer: Kafka "
        "appends it unless that producer's transaction is open on the partition (here it was "
        "only added), and then answers the transaction's own first batch, which repeats its "
        "sequence, as a duplicate: the transaction commits a record that is not its own and "
        "loses its own. onceflow refuses such a batch with INVALID_TXN_STATE, so that nobody "
        "can take the sequences of a transactional producer's next transaction.",
    ),
    KeptDifference(
        "consumer_group_epochs_and_fencing",
        ("commit at the old epoch",),
        "A KIP-848 member's commit at an epoch older than its current one: Kafka 4.4 accepts it "
        "for partitions the member has held since that epoch (KIP-1251, the assignment epochs "
        "of ConsumerGroupCurrentMemberAssignment); onceflow requires the member's current "
        "epoch, as Kafka 4.0-4.2 did (STALE_MEMBER_EPOCH; the client retries at its epoch).",
    ),
)


def kept_steps(scenario: str) -> dict[str, str]:
    """The steps of `scenario` that may differ, with the reason."""
    return {step: d.reason for d in KEPT if d.scenario == scenario for step in d.steps}
