"""Transaction state while the cleaner walks batches in offset order (Kafka's
CleanedTransactionMetadata).

It is told the partition's aborted transactions (producer id, first offset, last offset: the
`.txnindex` entries) and sees every batch in order. From that it knows:
- which data batches belong to an aborted transaction (their records are removed);
- when a COMMIT or ABORT marker may be removed: a COMMIT once no data batch of its transaction
  was seen in this pass (all of it was cleaned away before), an ABORT once its transaction's
  data batches are all gone (none seen); the cleaner then still keeps the marker until its
  delete horizon has passed;
- which aborted transactions still have their ABORT marker in the cleaned output, so that the
  cleaned segment's aborted-transaction index can be written again (`take_retained_aborted`).

A transaction that has no marker yet is simply never in the aborted list, so its data is never
removed as aborted (the cleaner also never reaches the last stable offset).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Protocol

from onceflow.records.batch import BatchHeader
from onceflow.records.control import ControlType


class AbortedTransaction(Protocol):
    """An aborted transaction of the partition, as the `.txnindex` records it
    (onceflow.log.aborted_index.AbortedTxn is one)."""

    @property
    def producer_id(self) -> int: ...

    @property
    def first_offset(self) -> int: ...

    @property
    def last_offset(self) -> int: ...


class _AbortedInProgress:
    __slots__ = ("aborted", "last_observed_batch_offset")

    def __init__(self, aborted: AbortedTransaction) -> None:
        self.aborted = aborted
        self.last_observed_batch_offset: int | None = None


class CleanedTransactions:
    """What one pass of the cleaner knows of transactions, up to the batch it last read."""

    def __init__(self, aborted: Iterable[AbortedTransaction] = ()) -> None:
        self._ongoing_committed: set[int] = set()
        self._ongoing_aborted: dict[int, _AbortedInProgress] = {}
        # aborted transactions not reached yet, smallest first offset first
        self._pending: list[tuple[int, int, AbortedTransaction]] = []
        self._sequence = 0
        self._retained: list[AbortedTransaction] = []
        self.add_aborted(aborted)

    def add_aborted(self, aborted: Iterable[AbortedTransaction]) -> None:
        for txn in aborted:
            heapq.heappush(self._pending, (txn.first_offset, self._sequence, txn))
            self._sequence += 1

    def _consume_aborted_up_to(self, offset: int) -> None:
        pending = self._pending
        while pending and pending[0][0] <= offset:
            txn = heapq.heappop(pending)[2]
            if txn.producer_id not in self._ongoing_aborted:
                self._ongoing_aborted[txn.producer_id] = _AbortedInProgress(txn)

    def on_data_batch(self, header: BatchHeader) -> bool:
        """Note a data batch; True when it belongs to an aborted transaction (discard it)."""
        self._consume_aborted_up_to(header.last_offset)
        if not header.is_transactional:
            return False
        in_progress = self._ongoing_aborted.get(header.producer_id)
        if in_progress is not None:
            in_progress.last_observed_batch_offset = header.last_offset
            return True
        self._ongoing_committed.add(header.producer_id)
        return False

    def on_control_batch(self, header: BatchHeader, control_type: int | None) -> bool:
        """Note a control batch whose first record has `control_type` (None: the batch is
        empty); True when the marker may be discarded (its transaction's data is all gone)."""
        self._consume_aborted_up_to(header.last_offset)
        if control_type is None:
            return True  # cleaned empty before: nothing left to keep it for
        producer_id = header.producer_id
        if control_type == ControlType.ABORT:
            in_progress = self._ongoing_aborted.pop(producer_id, None)
            if in_progress is not None and in_progress.last_observed_batch_offset is not None:
                # data of the aborted transaction is still in the log: keep the marker, and its
                # entry in the cleaned segment's aborted-transaction index
                self._retained.append(in_progress.aborted)
                return False
            return True
        if control_type == ControlType.COMMIT:
            if producer_id in self._ongoing_committed:
                self._ongoing_committed.discard(producer_id)
                return False
            return True
        return False  # other control types are never removed

    def take_retained_aborted(self) -> list[AbortedTransaction]:
        """Aborted transactions whose ABORT marker was kept since the last call, in order:
        the entries of the cleaned segment's `.txnindex`."""
        retained, self._retained = self._retained, []
        return retained
