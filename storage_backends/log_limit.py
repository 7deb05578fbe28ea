"""LogLimiter: one traceback per kind of failure, then a counted summary at most once a while."""

from __future__ import annotations

import logging
import threading
import time


class LogLimiter:
    """Keeps a failure that repeats on every page from flooding the log.

    The first failure of each ``what`` is logged with its traceback; later
    ones are counted and summarised in one line at most every ``interval_s``.
    Thread-safe.
    """

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, int]] = {}  # what -> (last logged, suppressed)

    def failure(self, what: str, exc: BaseException) -> None:
        """Record one failure of kind ``what`` caused by ``exc``."""
        now = time.monotonic()
        with self._lock:
            last = self._seen.get(what)
            if last is None:
                self._seen[what] = (now, 0)
            elif now - last[0] < self._interval_s:
                self._seen[what] = (last[0], last[1] + 1)
                return
            else:
                self._seen[what] = (now, 0)
        if last is None:
            self._logger.warning("%s", what, exc_info=exc)
        else:
            self._logger.warning("%s (%d more since the last report): %s", what, last[1] + 1, exc)
