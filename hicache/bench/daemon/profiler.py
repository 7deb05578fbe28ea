"""``python -m hicache.bench.daemon.profiler OUT ARGS...``: the daemon under cProfile, for benches.

Runs ``hicache.daemon``'s command line with ``ARGS`` while every thread it
starts (socket loop, readers, writer) is profiled on its own ``cProfile``
profiler; when the daemon exits, the threads' figures are merged into one
``pstats`` file at ``OUT`` (read it with ``python -m pstats OUT``). Only the
benches start the daemon this way (``hicache bench daemon --profile DIR``);
the daemon itself carries no profiling code. ``HICACHE_PROFILE_TIMER=cpu``
counts each thread's CPU time instead of wall time (waits then cost nothing).
"""

from __future__ import annotations

import cProfile
import logging
import os
import pstats
import sys
import threading
import time
from types import FrameType

logger = logging.getLogger(__name__)


class ThreadProfiles:
    """One profiler per thread, created when the thread first runs Python code.

    ``install`` profiles the calling thread and every thread started after it;
    ``dump`` merges them into one file (call it once the threads are done).
    Thread-safe.
    """

    def __init__(self) -> None:
        self._profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()

    def _new(self) -> cProfile.Profile:
        cpu = os.environ.get("HICACHE_PROFILE_TIMER") == "cpu"
        profile = cProfile.Profile(time.thread_time) if cpu else cProfile.Profile()
        with self._lock:
            self._profiles.append(profile)
        return profile

    def _start_thread(self, _frame: FrameType, _event: str, _arg: object) -> None:
        # threading calls this hook once in each new thread: swap it for a real profiler.
        self._new().enable()

    def install(self) -> None:
        threading.setprofile(self._start_thread)  # type: ignore[arg-type]
        self._new().enable()

    def dump(self, path: str) -> None:
        threading.setprofile(None)  # type: ignore[arg-type]
        with self._lock:
            profiles = list(self._profiles)
        for profile in profiles:
            profile.disable()
        stats = pstats.Stats(profiles[0])
        for profile in profiles[1:]:
            stats.add(profile)
        stats.dump_stats(path)


def main(argv: list[str]) -> int:
    if not argv:
        print(
            "usage: python -m hicache.bench.daemon.profiler OUT [daemon args...]", file=sys.stderr
        )
        return 2
    from hicache.daemon.cli import main as daemon_main

    profiles = ThreadProfiles()
    profiles.install()
    try:
        return daemon_main(argv[1:])
    finally:
        profiles.dump(argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
