"""Moved to onceflow.log.producer_errors (the partition side's errors belong to the log).

Kept only for coordinator_runtime.py, which i22-layers moves into coordinator/ this session:
on merge it imports onceflow.log.producer_errors and this module goes.
"""

from onceflow.log.producer_errors import TxnError, TxnIndexStorageError

__all__ = ["TxnError", "TxnIndexStorageError"]
