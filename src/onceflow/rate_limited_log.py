"""Rate-limited logging: a line that repeats (EMFILE at accept, refused connections) is written
once per interval with a count of what was suppressed, so a storm cannot fill the disk."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    """Log each distinct key at most once per `interval` seconds.

    The first occurrence is logged at once; later ones within the interval are counted and the
    count is appended to the next line logged for that key.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 1024,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self.max_keys = max_keys  # the table itself must not grow without bound
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(
        self, level: int, key: str, msg: str, *args: object, exc_info: bool | BaseException = False
    ) -> bool:
        """Log `msg % args` unless `key` was logged less than `interval` ago; True if logged."""
        if not self.logger.isEnabledFor(level):
            return False
        suppressed = self.admit(key)
        if suppressed is None:
            return False
        if suppressed:
            msg += " (%d similar message(s) suppressed)"
            args = (*args, suppressed)
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def admit(self, key: str) -> int | None:
        """None if `key` was let through less than `interval` ago (the call is counted);
        otherwise the number of calls suppressed since it last was."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return None
        if last is None and len(self._last) >= self.max_keys:
            self._forget_oldest(now)
        self._last[key] = now
        return self._suppressed.pop(key, 0)

    def warning(self, key: str, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, msg, *args)

    def info(self, key: str, msg: str, *args: object) -> bool:
        return self.log(logging.INFO, key, msg, *args)

    def error(
        self, key: str, msg: str, *args: object, exc_info: bool | BaseException = False
    ) -> bool:
        return self.log(logging.ERROR, key, msg, *args, exc_info=exc_info)

    def _forget_oldest(self, now: float) -> None:
        expired = [k for k, t in self._last.items() if now - t >= self.interval]
        for k in expired or list(self._last)[: len(self._last) // 2]:
            self._last.pop(k, None)
            self._suppressed.pop(k, None)
