"""A logger that says the same thing at most once per interval, counting what it held back.

A failure that repeats every tick (a background loop's bug, a descriptor shortage while
flushing) must be visible without flooding the log: the first occurrence is logged at once,
the next ones once per interval with the number suppressed meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

DEFAULT_INTERVAL_S = 60.0


class RateLimitedLog:
    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}  # message format -> when it was last logged
        self._suppressed: dict[str, int] = {}

    def log(self, level: int, msg: str, *args: object, exc_info: bool = False) -> bool:
        """Log unless `msg` (the format, not its arguments) was logged within the interval;
        returns whether it was logged."""
        now = self._clock()
        last = self._last.get(msg)
        if last is not None and now - last < self._interval_s:
            self._suppressed[msg] = self._suppressed.get(msg, 0) + 1
            return False
        self._last[msg] = now
        held = self._suppressed.pop(msg, 0)
        if held:
            msg = f"{msg} (and {held} more like it since)"
        self._logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def warning(self, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, msg, *args)

    def error(self, msg: str, *args: object, exc_info: bool = False) -> bool:
        return self.log(logging.ERROR, msg, *args, exc_info=exc_info)
