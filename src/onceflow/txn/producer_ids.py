"""Durable producer id allocation: blocks of ids reserved by records in the transaction log.

As Kafka's ProducerIdManager, ids are handed out from a block; a block is reserved by writing
its record. An id may reach a client only once its block's record is durable, so every
allocation from a block not yet replayed carries the block's record with it (writing it twice
is harmless: replay keeps the highest end). After a restart, replay restores the end of the
highest durable block and allocation starts a new block there: no id is ever handed out twice,
though ids of a block cut short by a restart are skipped.
"""

from __future__ import annotations

from onceflow.txn.coordinator_errors import ProducerIdsExhaustedError
from onceflow.txn.transaction_log import ProducerIdBlock, producer_id_block_record

PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
_MAX_PRODUCER_ID = 2**63 - 1

Record = tuple[bytes, bytes | None]


class ProducerIdManager:
    """Hands out producer ids; state changes from durable blocks only through `replay`."""

    def __init__(self, block_size: int = PRODUCER_ID_BLOCK_SIZE) -> None:
        if block_size <= 0:
            raise ValueError(f"block size must be positive, not {block_size}")
        self._block_size = block_size
        self._block: ProducerIdBlock | None = None
        self._next = 0
        # End of the highest block reserved by this process (durable or not) and of the
        # highest block known durable: new blocks start past both.
        self._reserved_end = 0
        self._durable_end = 0

    @property
    def durable_end(self) -> int:
        """First producer id after the highest durable block (ids below may have been used)."""
        return self._durable_end

    def allocate(self) -> tuple[int, list[Record]]:
        """A fresh producer id, and the records that must be durable before it is answered."""
        block = self._block
        if block is None or self._next >= block.end:
            start = max(self._reserved_end, self._durable_end)
            if start + self._block_size - 1 > _MAX_PRODUCER_ID:
                raise ProducerIdsExhaustedError(f"no producer id block left after {start}")
            block = ProducerIdBlock(start, self._block_size)
            self._block = block
            self._next = start
            self._reserved_end = block.end
        producer_id = self._next
        self._next += 1
        records: list[Record] = []
        if block.end > self._durable_end:
            records.append(producer_id_block_record(block))
        return producer_id, records

    def replay(self, block: ProducerIdBlock) -> None:
        """A block record is durable (written now, or read back while loading)."""
        self._durable_end = max(self._durable_end, block.end)
