"""Fuzzing decode_batch and validate_produce: only typed RecordsError may come out.

Half of the mutated batches get their length and CRC fixed afterwards, so that the decoder
parses the mutated records instead of stopping at the checksum.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.records.builder import build_batch
from onceflow.records.errors import RecordsError
from onceflow.records.record import decode_batch, iter_decoded_batches
from onceflow.records.validation import validate_produce

SEEDS = [
    build_batch(
        [(b"key", b"value", (("h", b"x"), ("n", None)), 1000), (None, b"v" * 40, (), 990)],
        compression=codec,
        producer_id=3,
        producer_epoch=0,
        base_sequence=0,
    )
    for codec in range(5)
] + [build_batch([(b"k" * 3, None, (), 5)] * 6, compression=0)]


def _exercise(data: bytes) -> None:
    for call in (
        lambda: decode_batch(data),
        lambda: decode_batch(data, verify_crc=False),
        lambda: list(iter_decoded_batches(data, verify_crc=False)),
        lambda: validate_produce(data),
        lambda: validate_produce(data, deep=True, single_batch=False),
    ):
        with contextlib.suppress(RecordsError):
            call()


fuzz = settings(max_examples=300, deadline=None)


@fuzz
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    _exercise(data)


@fuzz
@given(st.binary(min_size=61 - 17, max_size=150), st.sampled_from([0, 1, 2]))
def test_random_bytes_behind_a_plausible_prefix(tail: bytes, magic_choice: int) -> None:
    # base offset 0, a length matching the data, leader epoch, magic 2: gets past the framing
    body = bytes([0, 0, 0, 0]) + bytes([2, 2, 1][magic_choice : magic_choice + 1]) + tail
    data = bytes(8) + len(body).to_bytes(4, "big") + body
    _exercise(data)


@fuzz
@given(
    seed=st.sampled_from(SEEDS),
    edits=st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(0, 255), st.sampled_from("rid")),
        min_size=1,
        max_size=6,
    ),
    fix_crc=st.booleans(),
)
def test_mutated_batches(
    recrc: Callable[[bytes | bytearray], bytes],
    seed: bytes,
    edits: list[tuple[int, int, str]],
    fix_crc: bool,
) -> None:
    data = bytearray(seed)
    for where, byte, op in edits:
        i = where % (len(data) + 1)
        if op == "r" and i < len(data):
            data[i] = byte
        elif op == "i":
            data.insert(i, byte)
        elif op == "d" and i < len(data):
            del data[i]
    # keep the length field consistent half of the time, so records are parsed more often
    if fix_crc and len(data) >= 12:
        data[8:12] = (len(data) - 12).to_bytes(4, "big", signed=True)
    _exercise(recrc(data) if fix_crc else bytes(data))


@fuzz
@given(seed=st.sampled_from(SEEDS), cut=st.integers(0, 400))
def test_truncations(seed: bytes, cut: int) -> None:
    _exercise(seed[: cut % (len(seed) + 1)])


@fuzz
@given(
    codec=st.integers(1, 4),
    payload=st.binary(max_size=120),
    count=st.integers(-2, 5),
)
def test_garbage_compressed_payloads(
    frame: Callable[..., bytes], codec: int, payload: bytes, count: int
) -> None:
    _exercise(frame(payload, attributes=codec, records_count=count, last_offset_delta=count - 1))
