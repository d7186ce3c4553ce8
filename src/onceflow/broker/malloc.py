"""Give freed request and response buffers back to the operating system.

glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), after which
buffers of many MiB come from the heap and stay in the process when freed: a broker that served
big fetches keeps that memory after the clients leave. A fixed threshold keeps every buffer of
1 MiB or more in its own mapping, unmapped when freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 1 << 20


def use_mmap_for_large_buffers(threshold: int = MMAP_THRESHOLD) -> bool:
    """True if set (glibc); elsewhere the allocator's own policy stays."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        log.debug("no mallopt in %s: the allocator keeps its own policy", name)
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))
