"""One bounded poll for tests that wait on a state a backend reaches by itself
(a reconnect, a reloaded slot map, an expired lease), where no event exists
to wait on: each round checks a real reply, and the wait has a bound."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def wait_until(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Call ``check`` until it returns True (then True) or ``timeout_s`` passes (then False)."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while time.monotonic() < deadline:
        if check():
            return True
        pause.wait(interval_s)
    return False
