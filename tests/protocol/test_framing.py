"""FrameReader: whatever way a stream of frames is cut into received chunks, the same frames
come out, each size is announced before its body is needed, and bad sizes are refused."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.protocol.errors import FrameTooLargeError, ProtocolError
from onceflow.protocol.framing import FrameReader


def _stream(frames: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(f)) + f for f in frames)


@given(
    frames=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=8000), max_size=40),
)
def test_any_chunking_gives_back_the_frames(frames: list[bytes], cuts: list[int]) -> None:
    stream = _stream(frames)
    bounds = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    reader = FrameReader(max_bytes=1 << 20)
    out: list[bytes] = []
    for start, end in itertools.pairwise(bounds):
        reader.feed(stream[start:end])
        prefix_read = reader.pending_size() is not None  # a size read is consumed
        assert reader.buffered == end - sum(4 + len(f) for f in out) - 4 * prefix_read
        while (frame := reader.next_frame()) is not None:
            out.append(frame)
    assert out == frames
    assert reader.buffered == 0
    assert reader.pending_size() is None


def test_size_is_known_before_the_body_arrives() -> None:
    reader = FrameReader(max_bytes=1000)
    reader.feed(struct.pack(">i", 500)[:3])
    assert reader.pending_size() is None
    reader.feed(struct.pack(">i", 500)[3:] + b"x" * 10)
    assert reader.pending_size() == 500
    assert reader.next_frame() is None
    reader.feed(b"y" * 490)
    assert reader.next_frame() == b"x" * 10 + b"y" * 490


@pytest.mark.parametrize(
    ("size", "error"), [(-1, ProtocolError), (1001, FrameTooLargeError)], ids=["neg", "big"]
)
def test_bad_sizes_are_refused(size: int, error: type[Exception]) -> None:
    reader = FrameReader(max_bytes=1000)
    reader.feed(struct.pack(">i", size) + b"abc")
    with pytest.raises(error):
        reader.pending_size()


def test_clear_drops_everything() -> None:
    reader = FrameReader(max_bytes=1000)
    reader.feed(_stream([b"abc"])[:5])
    assert reader.pending_size() == 3
    reader.clear()
    assert reader.buffered == 0
    reader.feed(_stream([b"de"]))
    assert reader.next_frame() == b"de"
