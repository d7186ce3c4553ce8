"""Halting the process: exit at once, without the clean-shutdown writes, as Kafka's Exit.halt.

Below everything that halts (the group commit, the coordinators' driver, the broker), so that
none of them imports the broker to stop it; what counts as a storage failure is
broker/storage_failure.py.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("onceflow.broker.storage_failure")

HALT_EXIT_CODE = 1


def halt(error: BaseException) -> None:
    """Exit now, without the clean-shutdown writes."""
    log.critical("halting: a write to the data directory failed: %r", error)
    logging.shutdown()
    os._exit(HALT_EXIT_CODE)
