"""Atheris entry point for long runs of the record batch decoder (hypothesis covers CI).

    pip install atheris
    python fuzz/atheris_records.py -max_total_time=3600 fuzz/corpus-records
    python fuzz/atheris_records.py --make-corpus fuzz/corpus-records   # valid seed batches

Only RecordsError subclasses may come out of the decoder and the produce validation; any other
exception is a crash that atheris reports with the input that caused it. Each input is tried
as it is and, when long enough, with its batch length and CRC fixed, so that mutations reach
the record parser behind the checksum.
"""

from __future__ import annotations

import contextlib
import struct
import sys
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from onceflow.records.batch import HEADER_SIZE, compute_crc, iter_batches
    from onceflow.records.builder import build_batch
    from onceflow.records.control import build_marker, parse_control_record
    from onceflow.records.errors import RecordsError
    from onceflow.records.record import decode_batch, iter_decoded_batches
    from onceflow.records.validation import validate_produce


def _fixed(data: bytes) -> bytes:
    buf = bytearray(data)
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    struct.pack_into(">I", buf, 17, compute_crc(buf, 0, len(buf)))
    return bytes(buf)


def _exercise(data: bytes) -> None:
    for call in (
        lambda: decode_batch(data),
        lambda: list(iter_decoded_batches(data, verify_crc=False)),
        lambda: list(iter_batches(data)),
        lambda: validate_produce(data, deep=True, single_batch=False),
    ):
        with contextlib.suppress(RecordsError):
            call()
    with contextlib.suppress(RecordsError):
        batch = decode_batch(data, verify_crc=False)
        if batch.header.is_control and batch.records:
            parse_control_record(batch.records[0])


def test_one_input(data: bytes) -> None:
    _exercise(data)
    if len(data) >= HEADER_SIZE:
        _exercise(_fixed(data))


def make_corpus(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    seeds = [
        build_batch(
            [(b"k", b"v" * 30, (("h", b"x"),), 1_700_000_000_000), (None, None, (), 5)],
            compression=codec,
            producer_id=7,
            producer_epoch=1,
            base_sequence=3,
            transactional=codec % 2 == 1,
        )
        for codec in range(5)
    ]
    seeds.append(build_marker(7, 1, True, 0, 1_700_000_000_000))
    for i, seed in enumerate(seeds):
        (directory / f"seed-{i}").write_bytes(seed)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--make-corpus":
        make_corpus(Path(sys.argv[2]))
        sys.exit(0)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
