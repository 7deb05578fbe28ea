"""A small shared-memory plane on a fake clock, for the plane's own tests."""

from __future__ import annotations

from hicache.daemon.shm_extents import GRAIN

SIZE = 64 * GRAIN
EXPIRES_S = 3.0


class Clock:
    """A clock the test moves by hand (``clock.now += ...``)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now
