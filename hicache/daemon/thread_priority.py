"""Thread priority: the daemon's background threads yield the CPU to its socket thread.

On a machine whose cores are busy, a thread that wakes up waits for a core; the
socket thread wakes for every request, so its waits are every client's latency.
The writer (commits, which copy every page into the store) and the readers
burn most of the daemon's CPU: lowering their scheduling priority (a higher
nice value) lets the kernel run the socket thread first when both are ready,
while they still get every core nobody else wants.

Linux schedules threads, not processes: ``setpriority`` on a thread's id
changes that thread only. Elsewhere the same call would change the whole
process, so there this does nothing.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

logger = logging.getLogger(__name__)

MAX_NICE = 19  # the lowest priority an unprivileged thread can give itself


def lower_this_thread(nice: int) -> bool:
    """Add ``nice`` (0..19) to the calling thread's nice value (capped at 19). True when the
    priority was lowered; False for ``nice`` 0, off Linux, or when the OS refused (logged).
    Mutates only the calling thread's scheduling priority; raises ValueError for a ``nice``
    out of range."""
    if not 0 <= nice <= MAX_NICE:
        raise ValueError(f"nice must be 0..{MAX_NICE}, got {nice}")
    if nice == 0 or not sys.platform.startswith("linux"):
        return False
    thread_id = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, thread_id)
        os.setpriority(os.PRIO_PROCESS, thread_id, min(MAX_NICE, current + nice))
    except OSError as exc:
        logger.warning(
            "could not lower the priority of %s: %s", threading.current_thread().name, exc
        )
        return False
    return True
