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
