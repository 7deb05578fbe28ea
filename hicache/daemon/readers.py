"""Readers: the daemon's pool of threads that answer reads (GET, EXISTS, CONTAINS) off the
socket thread."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from hicache.daemon.fair_queue import FairQueue
from hicache.daemon.thread_priority import lower_this_thread
from storage_backends.remote.protocol import ErrorCode, ErrorReply, Reply, Request

logger = logging.getLogger(__name__)


class ReadJob(NamedTuple):
    """One read request as the socket thread routed it."""

    peer: bytes  # the ROUTER identity its reply goes to
    request: Request
    keys: tuple[bytes, ...]  # scoped keys
    tenant: str
    start: float  # perf_counter when it was received


class ReadDone(NamedTuple):
    """A read's reply; ``claimed`` reply-budget bytes and pool ``buffers`` the socket thread
    settles on send."""

    job: ReadJob
    reply: Reply
    claimed: int = 0
    failed: bool = False  # serve raised: a bug or a store failure (counted in the metrics)
    buffers: tuple[memoryview, ...] = ()  # reply-pool buffers the reply's frames are


class ReaderStats(NamedTuple):
    queued: int  # jobs waiting for a reader


ServeRead = Callable[[ReadJob], ReadDone]


class Readers:
    """``threads`` threads run ``serve`` on jobs taken from a per-peer ``FairQueue``.

    A peer's jobs run one at a time, in order (its reads together hold at most
    one reply's pages while being read); different peers' run in parallel.

    ``submit`` and ``take_done`` may be called from any thread; ``notify`` is
    called on a reader thread after each completion. ``serve`` should answer
    every failure itself; one that raises anyway becomes an INTERNAL reply
    marked ``failed`` (for the caller to count), and the thread carries on.
    ``close`` drops the jobs not yet started (returned, for the caller to
    answer or forget) and joins. The threads run ``nice`` (0..19, see
    ``thread_priority``) below their starter's priority.
    """

    def __init__(
        self, threads: int, serve: ServeRead, notify: Callable[[], None], nice: int = 0
    ) -> None:
        self._serve = serve
        self._nice = nice
        self._notify = notify
        self._jobs: FairQueue[ReadJob] = FairQueue()
        self._done: queue.SimpleQueue[ReadDone] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name=f"daemon-reader-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def stats(self) -> ReaderStats:
        return ReaderStats(len(self._jobs))

    def submit(self, job: ReadJob) -> bool:
        """Queue ``job`` behind its peer's earlier reads; False once closed."""
        return self._jobs.push(job.peer, job)

    def take_done(self) -> list[ReadDone]:
        done: list[ReadDone] = []
        while True:
            try:
                done.append(self._done.get_nowait())
            except queue.Empty:
                return done

    def close(self, timeout_s: float) -> tuple[list[ReadJob], bool]:
        """Drop queued jobs (returned), let running ones finish; False if a thread is
        still running after ``timeout_s``."""
        dropped = self._jobs.close()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return dropped, not any(thread.is_alive() for thread in self._threads)

    def _run(self) -> None:
        lower_this_thread(self._nice)
        while (job := self._jobs.pop()) is not None:
            self._done.put(self._answer(job))
            self._jobs.done(job.peer)
            self._notify()

    def _answer(self, job: ReadJob) -> ReadDone:
        try:
            return self._serve(job)
        except Exception as exc:  # the thread must outlive any failure
            logger.exception("read failed")
            reply = ErrorReply(job.request.id, ErrorCode.INTERNAL, f"{exc!r:.200}")
            return ReadDone(job, reply, failed=True)
