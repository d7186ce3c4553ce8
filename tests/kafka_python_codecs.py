"""Let kafka-python compress and decompress every codec.

Its optional codec packages (python-snappy, lz4, zstandard) are not installed; cramjam (which
aiokafka uses itself) stands in for the raw algorithms, while kafka-python keeps its own
framing (xerial for snappy, as the Java client writes it) and its own batch code.
"""

from __future__ import annotations

import cramjam
import kafka.codec
import kafka.record.default_records as kafka_records
import pytest


class _RawSnappy:
    """What kafka-python needs of python-snappy (raw blocks; it does the xerial framing)."""

    @staticmethod
    def compress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.compress_raw(data))

    @staticmethod
    def decompress(data: bytes) -> bytes:
        return bytes(cramjam.snappy.decompress_raw(data))


def _lz4_frame(data: bytes) -> bytes:
    # cramjam's default frame: linked blocks plus block and content checksums, a variant of the
    # format other than the one onceflow writes, which the decoder must read as well
    return bytes(cramjam.lz4.compress(data))


def use_cramjam(mp: pytest.MonkeyPatch) -> None:
    """Back each codec kafka-python lacks with cramjam, for as long as `mp` lasts."""
    if not kafka.codec.has_snappy():
        mp.setattr(kafka.codec, "snappy", _RawSnappy)
    if not kafka.codec.has_lz4():
        # has_lz4() looks for the module: the producer and the batch code both ask it
        mp.setattr(kafka.codec, "lz4", cramjam.lz4)
        mp.setattr(kafka_records, "lz4_encode", _lz4_frame)
        mp.setattr(kafka_records, "lz4_decode", lambda d: bytes(cramjam.lz4.decompress(d)))
    if not kafka.codec.has_zstd():
        mp.setattr(kafka.codec, "zstd", cramjam.zstd)
        mp.setattr(kafka_records, "zstd_encode", lambda d: bytes(cramjam.zstd.compress(d)))
        mp.setattr(kafka_records, "zstd_decode", lambda d: bytes(cramjam.zstd.decompress(d)))
