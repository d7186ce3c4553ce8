"""Kafka framing: every request and response is an int32 size followed by that many bytes."""

from __future__ import annotations

import struct

from onceflow.protocol.errors import FrameTooLargeError, ProtocolError

SIZE = struct.Struct(">i")


def check_frame_size(size: int, max_bytes: int) -> None:
    """Validate an announced frame size before reading the frame into memory."""
    if size < 0:
        raise ProtocolError(f"negative frame size {size}")
    if size > max_bytes:
        raise FrameTooLargeError(
            f"frame of {size} bytes exceeds socket.request.max.bytes={max_bytes}"
        )


def frame(payload: bytes | bytearray) -> bytes:
    return SIZE.pack(len(payload)) + payload


class FrameReader:
    """Sans-IO splitting of a byte stream into request frames.

    The size prefix is checked as soon as it is complete (`pending_size`), so that the caller
    can refuse it, or reserve memory for it, before any of the body is kept.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()
        self._size: int | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def pending_size(self) -> int | None:
        """The checked size of the frame being received, None until its prefix is complete."""
        if self._size is None:
            if len(self._buf) < SIZE.size:
                return None
            size = SIZE.unpack_from(self._buf)[0]
            check_frame_size(size, self.max_bytes)
            self._size = size
        return self._size

    def next_frame(self) -> bytes | None:
        """The next whole frame (without its prefix), or None until it has all arrived."""
        size = self.pending_size()
        if size is None or len(self._buf) < SIZE.size + size:
            return None
        end = SIZE.size + size
        with memoryview(self._buf) as view:
            frame = bytes(view[SIZE.size : end])
        if end == len(self._buf):
            self._buf = bytearray()  # let a big frame's buffer go, not just shrink it
        else:
            del self._buf[:end]
        self._size = None
        return frame

    def clear(self) -> None:
        self._buf = bytearray()
        self._size = None
