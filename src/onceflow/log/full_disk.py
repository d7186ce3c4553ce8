"""A full disk, simulated in the log layer for fault runs where no small filesystem can be
mounted (mounting one needs root).

With `ONCEFLOW_FULL_DISK_FLAG=PATH` in the broker's environment, every write to a log (segment
data, offset and time indexes, aborted-transaction indexes, producer snapshots) fails with
ENOSPC while the file PATH exists, as on a full disk: a fault harness creates the file to fill
the disk and removes it to free it. Unset, a write pays one comparison.
"""

from __future__ import annotations

import errno
import os

FULL_DISK_ENV = "ONCEFLOW_FULL_DISK_FLAG"

_flag = os.environ.get(FULL_DISK_ENV) or None


def check_space() -> None:
    """Raise ENOSPC if the simulated disk is full."""
    if _flag is not None and os.path.exists(_flag):
        raise OSError(errno.ENOSPC, "No space left on device (simulated full disk)")
