"""The vLLM tier's I/O workers: load and store jobs run off the scheduler thread.

vLLM calls its secondary tiers on the scheduler thread, under the tiering
manager's lock, and asks them never to block there. ``TierJobRunner`` takes a
job (a function that does the backend I/O), runs it on one of its threads and
hands back a ``FinishedJob`` record when the scheduler polls. Loads go before
queued stores: a load holds up a request, a store does not.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from hicache.integrations.common import FailureLog

logger = logging.getLogger(__name__)


class JobOutcome(NamedTuple):
    """What a job's I/O did: per-key success, in the job's key order, and the
    bytes it moved (successful keys only)."""

    ok: tuple[bool, ...]
    nbytes: int


class FinishedJob(NamedTuple):
    """One job done. ``outcome`` is None when the job raised (counted and
    logged); ``seconds`` is the time its I/O took on the worker."""

    job_id: int
    is_load: bool
    outcome: JobOutcome | None
    seconds: float


Work = Callable[[], JobOutcome]


class _Queued(NamedTuple):
    job_id: int
    is_load: bool
    work: Work


class TierJobRunner:
    """A fixed set of worker threads running load and store jobs.

    ``submit`` and ``finished`` never block on I/O (they take a short lock).
    ``wait_idle`` blocks until no job is queued or running. Thread-safe.
    A job that raises becomes a ``FinishedJob`` with ``outcome=None``; a
    worker thread never dies of a job's exception. After ``shutdown`` queued
    jobs are finished as failed and ``submit`` fails new jobs at once.
    """

    def __init__(self, workers: int, failures: FailureLog, name: str = "hicache-vllm") -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self._failures = failures
        self._cond = threading.Condition()
        self._loads: deque[_Queued] = deque()
        self._stores: deque[_Queued] = deque()
        self._done: list[FinishedJob] = []
        self._running = 0
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, job_id: int, is_load: bool, work: Work) -> None:
        """Queue ``work``; its record comes back from ``finished``."""
        with self._cond:
            if self._stopping:
                self._done.append(FinishedJob(job_id, is_load, None, 0.0))
                return
            (self._loads if is_load else self._stores).append(_Queued(job_id, is_load, work))
            self._cond.notify()

    def finished(self) -> list[FinishedJob]:
        """The jobs finished since the last call, in completion order."""
        with self._cond:
            done, self._done = self._done, []
        return done

    def busy(self) -> bool:
        """Whether a job is queued, running, or finished and not yet collected."""
        with self._cond:
            return bool(self._loads or self._stores or self._running or self._done)

    def wait_idle(self, log_every_s: float = 5.0) -> None:
        """Block until no job is queued or running (each job's I/O is bounded by
        the backend's timeout, so this ends); logs while it waits."""
        started = time.monotonic()
        with self._cond:
            while self._loads or self._stores or self._running:
                if not self._cond.wait(timeout=log_every_s):
                    logger.warning(
                        "hicache vLLM tier: still waiting for %d running and %d queued jobs "
                        "after %.0f s",
                        self._running,
                        len(self._loads) + len(self._stores),
                        time.monotonic() - started,
                    )

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Fail queued jobs, let running ones finish, stop the threads."""
        with self._cond:
            self._stopping = True
            for queued in (*self._loads, *self._stores):
                self._done.append(FinishedJob(queued.job_id, queued.is_load, None, 0.0))
            self._loads.clear()
            self._stores.clear()
            self._cond.notify_all()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _next(self) -> _Queued | None:
        with self._cond:
            while not (self._loads or self._stores or self._stopping):
                self._cond.wait()
            if self._stopping:
                return None
            self._running += 1
            return (self._loads or self._stores).popleft()

    def _loop(self) -> None:
        while (queued := self._next()) is not None:
            started = time.perf_counter()
            outcome: JobOutcome | None
            try:
                outcome = queued.work()
            except Exception as exc:  # a job's failure is a failed job, never a dead worker
                self._failures.failure("vLLM tier job", exc)
                outcome = None
            record = FinishedJob(
                queued.job_id, queued.is_load, outcome, time.perf_counter() - started
            )
            with self._cond:
                self._running -= 1
                self._done.append(record)
                self._cond.notify_all()
