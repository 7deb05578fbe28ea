"""Lifecycle: what a cache started (threads, sockets, stores), released exactly once.

Released by ``close()``, by a constructor that fails half-way, by garbage
collection, or at interpreter exit. The exit case matters: worker threads
are daemon threads, and one that comes back from native code (an LMDB
commit, a torch copy) after the interpreter started finalizing is stopped
by ``pthread_exit``, whose unwinding through C++ aborts the process
("terminate called without an active exception", exit 134).
``weakref.finalize`` runs at exit before that point, so the workers are
stopped while the interpreter is still whole.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable

logger = logging.getLogger(__name__)

Release = Callable[[], object]


def _release_all(releases: list[Release]) -> None:
    """Call every release, newest first; a failing one is logged, the rest still run."""
    while releases:
        release = releases.pop()
        try:
            release()
        except Exception:
            logger.exception("releasing %r failed", release)


class Lifecycle:
    """Releases registered by ``started`` run once, in reverse order.

    ``owner`` is watched through a weak reference only: releases must not
    refer to it (pass the parts' own ``close`` methods), or it would never
    be collected. Owner thread only.
    """

    def __init__(self, owner: object) -> None:
        self._releases: list[Release] = []
        self._finalizer = weakref.finalize(owner, _release_all, self._releases)

    def started(self, release: Release) -> None:
        """Register how to release something just started."""
        if not self._finalizer.alive:
            raise RuntimeError("lifecycle already released")
        self._releases.append(release)

    def release(self) -> None:
        """Release everything now (idempotent)."""
        self._finalizer()

    @property
    def released(self) -> bool:
        return not self._finalizer.alive
