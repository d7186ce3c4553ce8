"""`transactional_header`: what Produce looks at before validating, as Kafka's
RequestUtils.hasTransactionalRecords does (the first whole v2 batch only)."""

from __future__ import annotations

from onceflow.records.batch import transactional_header
from onceflow.records.builder import build_batch

RECORDS = [(None, b"v", (), 1_700_000_000_000)]


def test_a_transactional_batch_gives_its_producer() -> None:
    batch = build_batch(
        RECORDS, producer_id=42, producer_epoch=3, base_sequence=0, transactional=True
    )
    header = transactional_header(batch)
    assert header is not None
    assert (header.producer_id, header.producer_epoch) == (42, 3)
    # The CRC is not looked at (validation refuses the batch later).
    damaged = bytearray(batch)
    damaged[-1] ^= 0xFF
    assert transactional_header(bytes(damaged)) == header


def test_anything_else_gives_none() -> None:
    idempotent = build_batch(RECORDS, producer_id=42, producer_epoch=3, base_sequence=0)
    transactional = build_batch(
        RECORDS, producer_id=42, producer_epoch=3, base_sequence=0, transactional=True
    )
    assert transactional_header(idempotent) is None
    assert transactional_header(build_batch(RECORDS)) is None
    assert transactional_header(b"") is None
    assert transactional_header(transactional[:-1]) is None  # not whole
    v1 = bytearray(transactional)
    v1[16] = 1  # magic
    assert transactional_header(bytes(v1)) is None
    # Only the first batch counts.
    assert transactional_header(idempotent + transactional) is None
