"""A failed write to the data directory stops the broker at once, as Kafka stops when its last
log directory fails (LogManager.handleLogDirFailure: Exit.halt).

A write can fail half-way (a batch appended but not its index entry, an ABORT marker appended
but not its aborted-transaction entry, a transaction's markers partly written): memory and
disk then disagree, and carrying on would serve that state (aborted records to read_committed
readers, a retried batch appended twice, a transaction stuck in PrepareCommit). Halting skips
the clean-shutdown writes, so the restart rebuilds every state from what reached the disk.
"""

from __future__ import annotations

import errno

from onceflow.halt import halt
from onceflow.log.errors import DescriptorsExhaustedError, LogStorageError
from onceflow.log.producer_errors import TxnIndexStorageError

_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG})


def is_storage_error(error: BaseException | None) -> bool:
    """A failed write or sync of the data directory. Running out of file descriptors
    (DescriptorsExhaustedError, EMFILE, ENFILE) is not one: it is met before anything is
    written, and fails that one request with a retriable error."""
    if isinstance(error, DescriptorsExhaustedError):
        return False
    if isinstance(error, (LogStorageError, TxnIndexStorageError)):
        return True
    return isinstance(error, OSError) and error.errno in _STORAGE_ERRNOS


def halt_on_storage_error(error: BaseException | None) -> None:
    """Exit now (no clean shutdown) if `error` is a failed write to the data directory."""
    if is_storage_error(error):
        halt(error)
