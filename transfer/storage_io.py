"""Host <-> storage I/O workers: page puts and gets run off the owner thread."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import torch

from host_pool import HostKVPool
from storage_backends import StorageBackend

logger = logging.getLogger(__name__)


JobKind = Literal["put", "get", "prefetch", "lookup", "removed"]
Clock = Callable[[], float]


class ReadView(NamedTuple):
    """Where a prefetch's read stands: ``found`` leading pages in storage and
    ``planned`` to read (-1 both until the lookup is done), ``arrived``
    leading pages in host memory and verified (``nbytes``), ``started`` the
    clock time the read began (None before), ``cut``: stopped by the owner."""

    found: int
    planned: int
    arrived: int
    nbytes: int
    started: float | None
    cut: bool


class ReadProgress:
    """A prefetch's read as it goes, shared by the owner and the I/O worker
    running it. The worker records the lookup (``decided``) and each piece
    that ``landed``; the owner reads ``view()`` and may ``cut()`` the read:
    the worker then starts no further piece. Thread-safe."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._view = ReadView(-1, -1, 0, 0, None, False)

    def decided(self, found: int, planned: int) -> None:
        with self._lock:
            self._view = self._view._replace(found=found, planned=planned, started=self.clock())

    def landed(self, pages: int, nbytes: int) -> None:
        with self._lock:
            v = self._view
            self._view = v._replace(arrived=v.arrived + pages, nbytes=v.nbytes + nbytes)

    def cut(self) -> ReadView:
        """Stop the read after the piece in flight; what had arrived by now."""
        with self._lock:
            self._view = self._view._replace(cut=True)
            return self._view

    def view(self) -> ReadView:
        with self._lock:
            return self._view


@dataclass(frozen=True)
class StorageJob:
    """One unit of storage work, run on an I/O worker:

    - ``put``: write the host pages at ``host_slots`` under ``keys``;
    - ``get``: fill ``host_slots`` from storage;
    - ``prefetch``: look ``keys`` up (``exists``), then, if at least
      ``min_pages`` leading pages exist, get them into the first pages of
      ``host_slots`` (one job: the owner thread never waits for the lookup);
      ``plan`` (pure, any thread) says how many of the found pages to read
      (default: all), in pieces of ``piece_pages``, reported to ``progress``;
    - ``lookup``: count the leading ``keys`` present (no slots);
    - ``removed``: drain the backend's removal journal (no keys, no slots).

    ``host_slots`` covers whole pages, one per key (empty for lookup/removed).
    """

    kind: JobKind
    keys: tuple[bytes, ...]
    host_slots: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    min_pages: int = 1
    plan: Callable[[int], int] | None = None
    progress: ReadProgress | None = None
    piece_pages: int = 0  # 0: one piece


class OpTiming(NamedTuple):
    """One backend call a job made, timed on the worker that made it, and the
    bytes it moved (a get: the pages it found)."""

    op: Literal["exists", "get", "put"]
    seconds: float
    nbytes: int = 0


class StorageCompletion(NamedTuple):
    """One finished job: per-page results (all False on ``error``), bytes moved,
    leading pages found by a lookup (``prefetch``/``lookup``), the pages a
    prefetch chose to read of them, and the keys a ``removed`` job drained."""

    job_id: int
    kind: str
    results: tuple[bool, ...]
    error: str | None
    nbytes: int
    found: int = 0
    removed: tuple[bytes, ...] = ()
    timings: tuple[OpTiming, ...] = ()
    planned: int = 0

    @property
    def leading_hits(self) -> int:
        """Pages usable as a prefix: results up to the first failure."""
        return leading(self.results)


class StorageIO:
    """A pool of worker threads running StorageJobs against one backend.

    The owner thread calls ``submit``, ``poll``, ``wait`` and ``close``;
    workers only read or write host pages (which the owner keeps pinned until
    the completion is applied) and call the thread-safe backend. A job that
    raises becomes a completion with ``error`` set; workers never die.
    Raises RuntimeError on ``submit`` after ``close``.
    """

    def __init__(
        self,
        backend: StorageBackend,
        host_pool: HostKVPool,
        num_workers: int = 2,
        clock: Clock = time.perf_counter,
    ):
        self.backend = backend
        self._clock = clock  # times the backend calls (tests pass a fake one)
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
        slots = 0 if job.kind in ("lookup", "removed") else len(job.keys)
        if job.host_slots.numel() != slots * self._host.page_size:
            raise ValueError(f"a storage {job.kind} job needs one whole host page per key")
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
        clock = self._clock
        if job.kind == "put":
            src = self._host.page_bytes(job.host_slots)
            start = clock()
            results = self.backend.put(job.keys, src)
            nbytes = sum(len(v) for v, ok in zip(src, results, strict=True) if ok)
            timing = OpTiming("put", clock() - start, nbytes)
            return StorageCompletion(job_id, "put", tuple(results), None, nbytes, timings=(timing,))
        if job.kind == "removed":
            removed = tuple(self.backend.take_removed())
            return StorageCompletion(job_id, "removed", (), None, 0, removed=removed)
        if job.kind == "get":
            return self._get(job_id, job, len(job.keys), len(job.keys), ())
        start = clock()
        found = self.backend.exists(list(job.keys)) if job.keys else 0
        looked = (OpTiming("exists", clock() - start),) if job.keys else ()
        if job.kind == "lookup":
            return StorageCompletion(job_id, "lookup", (), None, 0, found=found, timings=looked)
        fetch = found if found >= job.min_pages else 0
        if fetch and job.plan is not None:
            fetch = max(0, min(fetch, job.plan(fetch)))
        if job.progress is not None:
            job.progress.decided(found, fetch)
        return self._get(job_id, job, fetch, found, looked)

    def _get(
        self, job_id: int, job: StorageJob, pages: int, found: int, timed: tuple[OpTiming, ...]
    ) -> StorageCompletion:
        """Get the first ``pages`` keys into the first pages of the job's slots,
        piece by piece; a piece with a miss, or a cut, ends the read (a prefix
        has no gaps). ``timed``: the backend calls the job made before."""
        results: list[bool] = []
        nbytes, step = 0, job.piece_pages or max(pages, 1)
        for lo in range(0, pages, step):
            if job.progress is not None and job.progress.view().cut:
                break
            got, sizes, timing = self._get_piece(job, lo, min(lo + step, pages))
            results += got
            nbytes += timing.nbytes
            timed = (*timed, timing)
            lead = leading(got)
            if job.progress is not None:
                job.progress.landed(lead, sum(sizes[:lead]))
            if lead < len(got):
                break
        padded = (*results, *(False,) * (len(job.keys) - len(results)))
        return StorageCompletion(
            job_id, job.kind, padded, None, nbytes, found, (), timed, planned=pages
        )

    def _get_piece(
        self, job: StorageJob, lo: int, hi: int
    ) -> tuple[list[bool], list[int], OpTiming]:
        """Pages ``[lo, hi)`` of the job into their host slots: hits, page sizes, timing."""
        ps = self._host.page_size
        sink = self._host.page_sink(job.host_slots[lo * ps : hi * ps])
        start = self._clock()
        got = list(self.backend.get(job.keys[lo:hi], sink.views))
        seconds = self._clock() - start
        sink.commit()
        sizes = [len(v) for v in sink.views]
        moved = sum(n for n, ok in zip(sizes, got, strict=True) if ok)
        return got, sizes, OpTiming("get", seconds, moved)


def leading(results: Sequence[bool]) -> int:
    """Pages usable as a prefix: results up to the first failure."""
    n = 0
    for ok in results:
        if not ok:
            break
        n += 1
    return n


def _left(deadline: float | None) -> float | None:
    """Seconds until ``deadline`` (None: no deadline), never negative."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())
