"""A circuit breaker: once the peer is seen to be down, fail fast for a while instead of waiting."""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable


class BreakerState(enum.Enum):
    CLOSED = "closed"  # calls go through
    OPEN = "open"  # calls fail fast until the cool-down ends
    HALF_OPEN = "half_open"  # one probe call is let through; the others fail fast


class Admission(enum.Enum):
    CALL = "call"  # closed: go ahead
    PROBE = "probe"  # the cool-down is over and this caller is the one probe
    REFUSE = "refuse"  # fail fast


class CircuitBreaker:
    """Tells whether a remote peer is worth a call.

    Two kinds of failure: ``record_down`` is evidence that the peer is gone (no
    reply in time, a refused or dropped connection) and opens the breaker at
    once; ``record_failure`` is a peer that answered badly (busy, an internal
    error), and ``failures`` of those in a row open it. Open, it fails fast for ``cooldown_s``; then
    one caller is let through as a probe. A successful probe closes the
    breaker; a failed one reopens it with twice the cool-down (up to
    ``max_cooldown_s``), so a peer that stays away costs one timeout per
    cool-down, not one per call. Thread-safe; ``clock`` is injectable for tests.
    """

    def __init__(
        self,
        failures: int,
        cooldown_s: float,
        max_cooldown_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failures < 1 or cooldown_s <= 0 or max_cooldown_s < cooldown_s:
            raise ValueError("need failures >= 1 and 0 < cooldown_s <= max_cooldown_s")
        self._threshold = failures
        self._base = cooldown_s
        self._max = max_cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._consecutive = 0
        self._cooldown = cooldown_s
        self._reopen_at = 0.0
        self._opened = 0

    @property
    def state(self) -> BreakerState:
        with self._lock:
            return self._state

    @property
    def times_opened(self) -> int:
        """How often the breaker went from closed to open (probes failing again not counted)."""
        with self._lock:
            return self._opened

    def allow(self) -> bool:
        """Whether a call may go to the peer now; False means fail fast."""
        return self.admit() is not Admission.REFUSE

    def admit(self) -> Admission:
        """``allow`` that also tells the one probe apart (it may check the peer cheaply
        first, e.g. with a PING, and report that outcome)."""
        with self._lock:
            if self._state is BreakerState.CLOSED:
                return Admission.CALL
            if self._state is BreakerState.OPEN and self._clock() >= self._reopen_at:
                self._state = BreakerState.HALF_OPEN  # this caller is the probe
                return Admission.PROBE
            return Admission.REFUSE

    def record_success(self) -> None:
        with self._lock:
            self._state = BreakerState.CLOSED
            self._consecutive = 0
            self._cooldown = self._base

    def record_failure(self) -> None:
        """The peer answered, badly: counts towards ``failures`` in a row."""
        with self._lock:
            self._consecutive += 1
            self._fail(self._consecutive >= self._threshold)

    def record_down(self) -> None:
        """Evidence that the peer is gone: open now (a probe that failed reopens)."""
        with self._lock:
            self._consecutive += 1
            self._fail(True)

    def _fail(self, enough: bool) -> None:
        if self._state is BreakerState.HALF_OPEN:
            self._cooldown = min(self._cooldown * 2, self._max)
            self._open()
        elif self._state is BreakerState.CLOSED and enough:
            self._opened += 1
            self._open()

    def _open(self) -> None:
        self._state = BreakerState.OPEN
        self._reopen_at = self._clock() + self._cooldown
