"""Host <-> storage I/O workers: page puts and gets run off the owner thread."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

from host_pool import HostKVPool
from storage_backends import StorageBackend

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StorageJob:
    """Write the host pages at ``host_slots`` under ``keys`` (put), or fill them
    from storage (get). ``host_slots`` covers whole pages, one per key."""

    kind: Literal["put", "get"]
    keys: tuple[bytes, ...]
    host_slots: torch.Tensor


class StorageCompletion(NamedTuple):
    """One finished job: per-page results (all False on ``error``) and bytes moved."""

    job_id: int
    kind: str
    results: tuple[bool, ...]
    error: str | None
    nbytes: int

    @property
    def leading_hits(self) -> int:
        """Pages usable as a prefix: results up to the first failure."""
        n = 0
        for ok in self.results:
            if not ok:
                break
            n += 1
        return n


class StorageIO:
    """A pool of worker threads running StorageJobs against one backend.

    The owner thread calls ``submit``, ``poll``, ``wait`` and ``close``;
    workers only read or write host pages (which the owner keeps pinned until
    the completion is applied) and call the thread-safe backend. A job that
    raises becomes a completion with ``error`` set; workers never die.
    Raises RuntimeError on ``submit`` after ``close``.
    """

    def __init__(self, backend: StorageBackend, host_pool: HostKVPool, num_workers: int = 2):
        self.backend = backend
        self._host = host_pool
        self._jobs: queue.Queue[tuple[int, StorageJob] | None] = queue.Queue()
        self._done: queue.Queue[StorageCompletion] = queue.Queue()
        self._finished: dict[int, StorageCompletion] = {}
        self._next_id = 0
        self._pending: set[int] = set()
        self._closed = False
        self._workers = [
            threading.Thread(target=self._work, name=f"hicache-storage-{i}", daemon=True)
            for i in range(max(1, num_workers))
        ]
        for worker in self._workers:
            worker.start()

    def submit(self, job: StorageJob) -> int:
        if self._closed:
            raise RuntimeError("storage I/O is closed")
        if job.host_slots.numel() != len(job.keys) * self._host.page_size:
            raise ValueError("a storage job needs one whole host page per key")
        self._next_id += 1
        self._pending.add(self._next_id)
        self._jobs.put((self._next_id, job))
        return self._next_id

    def pending(self) -> int:
        return len(self._pending)

    def poll(self) -> list[StorageCompletion]:
        """Finished jobs not yet returned, without blocking."""
        out = list(self._finished.values())
        self._finished.clear()
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                break
        for done in out:
            self._pending.discard(done.job_id)
        return out

    def wait(self, job_id: int, timeout_s: float | None = None) -> StorageCompletion | None:
        """Block until ``job_id`` finishes (it is then not returned by ``poll``),
        or ``timeout_s`` passed: None, and the job stays pending (a later
        ``poll`` or ``wait`` returns it). ValueError for an unknown job."""
        if job_id in self._finished:
            self._pending.discard(job_id)
            return self._finished.pop(job_id)
        if job_id not in self._pending:
            raise ValueError(f"unknown or already collected storage job {job_id}")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                done = self._done.get(timeout=_left(deadline))
            except queue.Empty:
                return None
            if done.job_id == job_id:
                self._pending.discard(job_id)
                return done
            self._finished[done.job_id] = done

    def close(self, timeout_s: float | None = None) -> bool:
        """Finish queued jobs, stop the workers and close the backend. Idempotent.

        With ``timeout_s``, gives up waiting for workers after that long and
        then leaves the backend open (closing it under a call in flight could
        crash; a store is crash-safe). Returns whether everything stopped.
        """
        if self._closed:
            return not any(w.is_alive() for w in self._workers)
        self._closed = True
        for _ in self._workers:
            self._jobs.put(None)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for worker in self._workers:
            worker.join(_left(deadline))
        stuck = sum(w.is_alive() for w in self._workers)
        if stuck:
            logger.warning(
                "%d storage workers still busy after %.1f s; not waiting", stuck, timeout_s
            )
            return False
        self.backend.close()
        return True

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            job_id, job = item
            try:
                done = self._run(job_id, job)
            except Exception as e:  # reported as a completion, never a dead worker
                logger.exception("storage %s job %d failed", job.kind, job_id)
                done = StorageCompletion(job_id, job.kind, (False,) * len(job.keys), str(e), 0)
            self._done.put(done)

    def _run(self, job_id: int, job: StorageJob) -> StorageCompletion:
        if job.kind == "put":
            src = self._host.page_bytes(job.host_slots)
            results = self.backend.put(job.keys, src)
            nbytes = sum(len(v) for v, ok in zip(src, results, strict=True) if ok)
            return StorageCompletion(job_id, "put", tuple(results), None, nbytes)
        sink = self._host.page_sink(job.host_slots)
        results = self.backend.get(job.keys, sink.views)
        sink.commit()
        nbytes = sum(len(v) for v, ok in zip(sink.views, results, strict=True) if ok)
        return StorageCompletion(job_id, "get", tuple(results), None, nbytes)


def _left(deadline: float | None) -> float | None:
    """Seconds until ``deadline`` (None: no deadline), never negative."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())
