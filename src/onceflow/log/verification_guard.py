"""What the transaction coordinator answered about a produced batch, asked before the append.

As Kafka's ReplicaManager verifies a transactional batch with the coordinator first and hands the
append a VerificationGuard, the broker asks its questions before the log is touched and passes
their answers here: the log never asks the coordinator anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class VerificationGuard:
    # KIP-890: none when the batch may open a transaction on this partition (or nothing needed
    # asking), else the coordinator's error as Produce answers it.
    verdict: ErrorCode = ErrorCode.none
    # The request's transactional id (a refusal of a batch without one is the log's own).
    transactional_id: str | None = None
    # An idempotent batch's producer id belongs to a transactional id (whose batches must be
    # transactional).
    transactional_producer: bool = False

    @property
    def verified(self) -> bool:
        return self.verdict == ErrorCode.none

    @property
    def refused(self) -> bool:
        """The coordinator refused the batch (Kafka answers those without the log start
        offset)."""
        return not self.verified and bool(self.transactional_id)
