"""A clock that moves only when a test (or a throttled fake store) says so."""

from __future__ import annotations

import threading


class FakeClock:
    """Callable like ``time.monotonic``; ``advance`` (thread-safe) moves it on,
    and doubles as ``sleep`` for a throttled store: its reads take fake time."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        with self._lock:
            self._now += seconds
