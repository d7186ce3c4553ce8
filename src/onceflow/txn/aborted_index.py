"""Moved to onceflow.log.aborted_index (the aborted-transaction index is the log's).

Kept only for broker/log_cleaner.py, which i22-layers rewrites this session: on merge it
imports onceflow.log.aborted_index and this module goes.
"""

from onceflow.log.aborted_index import AbortedTxn, encode_entries

__all__ = ["AbortedTxn", "encode_entries"]
