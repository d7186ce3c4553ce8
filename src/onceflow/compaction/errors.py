"""Typed errors of the log cleaner's core; the broker's cleaner task logs them and marks the
partition uncleanable, as Kafka's LogCleaner does with a LogCleaningException."""

from __future__ import annotations


class CleanerError(Exception):
    """Base class of the compaction package's errors."""


class CleanRangeError(CleanerError):
    """Batches handed to the cleaner lie outside the range it was told to clean (a caller bug
    that could otherwise touch undecided transactions or the active segment)."""


class OffsetMapConfigError(CleanerError):
    """An offset map too small to hold even one entry (Kafka refuses to start such a cleaner)."""
