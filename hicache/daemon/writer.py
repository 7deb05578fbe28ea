"""Writer: the daemon's one writer thread; PUTs waiting together are committed together."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import NamedTuple

from hicache.daemon.store import DaemonStore, check_record
from hicache.daemon.thread_priority import lower_this_thread
from storage_backends.page_format import Verdict
from storage_backends.remote.protocol import Frame, Op

logger = logging.getLogger(__name__)


class WriteJob(NamedTuple):
    """One PUT or DELETE request; ``token`` is the server's, returned untouched."""

    op: Op
    keys: tuple[bytes, ...]  # scoped keys
    records: tuple[Frame, ...]  # PUT only
    token: object
    tenant: str | None = None  # picks the tenant's own store when it has a quota
    client_keys: tuple[bytes, ...] = ()  # PUT: each record's header must match its key


class WriteDone(NamedTuple):
    """Outcome of one job: ``stored`` (PUT) or ``deleted`` (DELETE), or ``error`` text;
    ``malformed``: a PUT refused before any write because a record failed its check."""

    job: WriteJob
    stored: tuple[bool, ...] = ()
    deleted: int = 0
    error: str = ""
    malformed: bool = False


class WriterStats(NamedTuple):
    commits: int  # store.put calls (one store write transaction each)
    committed_requests: int  # PUT requests they carried (group commit: more than commits)
    failures: int  # batches that raised


class Writer:
    """Applies jobs in arrival order on its own thread and hands back ``WriteDone`` records.

    A PUT's records are checked (each header against its key in ``client_keys``:
    ``check_record``, no pass over the payload) here, off the socket thread, before
    anything is written: a PUT with one bad record stores nothing and completes
    ``malformed``; the others of its batch commit as usual. Records are written from
    the views they came in (received frames, or a shared-memory put area: a client
    that writes there before its reply can only damage its own record, which its
    first read then drops). ``submit`` and ``take_done`` may be called from any
    thread; ``notify`` is called (on the writer thread) after each batch of
    completions. A failing batch becomes error completions and the thread carries on
    (counted in ``stats``). ``close`` finishes every submitted job first. The thread
    runs ``nice`` (0..19, see ``thread_priority``) below its starter's priority.
    """

    def __init__(self, store: DaemonStore, notify: Callable[[], None], nice: int = 0) -> None:
        self._store = store
        self._nice = nice
        self._notify = notify
        self._jobs: queue.SimpleQueue[WriteJob | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[WriteDone] = queue.SimpleQueue()
        self._commits = 0
        self._committed_requests = 0
        self._failures = 0
        self._thread = threading.Thread(target=self._run, name="daemon-writer", daemon=True)
        self._thread.start()

    def stats(self) -> WriterStats:
        """Counters so far (read without a lock: each is written by the writer thread only)."""
        return WriterStats(self._commits, self._committed_requests, self._failures)

    def submit(self, job: WriteJob) -> None:
        self._jobs.put(job)

    def take_done(self) -> list[WriteDone]:
        done: list[WriteDone] = []
        while True:
            try:
                done.append(self._done.get_nowait())
            except queue.Empty:
                return done

    def close(self, timeout_s: float) -> bool:
        """Finish submitted jobs and stop; False if the thread did not end in time."""
        self._jobs.put(None)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        lower_this_thread(self._nice)
        while True:
            batch, stop = self._next_batch()
            refused = len(batch)
            batch = self._admit(batch)
            refused -= len(batch)
            start = 0
            while start < len(batch):
                end = start + 1
                first = batch[start]
                if first.op is Op.PUT:  # one commit per run of PUTs into the same store
                    while (
                        end < len(batch)
                        and batch[end].op is Op.PUT
                        and batch[end].tenant == first.tenant
                    ):
                        end += 1
                for done in self._apply(batch[start:end]):
                    self._done.put(done)
                start = end
            if batch or refused:
                self._notify()
            if stop:
                return

    def _admit(self, batch: list[WriteJob]) -> list[WriteJob]:
        """The jobs whose records pass their check; the others completed as malformed."""
        kept: list[WriteJob] = []
        for job in batch:
            bad = _bad_record(job) if job.op is Op.PUT else ""
            if bad:
                self._done.put(WriteDone(job, error=bad, malformed=True))
            else:
                kept.append(job)
        return kept

    def _next_batch(self) -> tuple[list[WriteJob], bool]:
        """Block for one job, then take every job already waiting (group commit)."""
        batch: list[WriteJob] = []
        item = self._jobs.get()
        while item is not None:
            batch.append(item)
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                return batch, False
        return batch, True

    def _apply(self, jobs: Sequence[WriteJob]) -> list[WriteDone]:
        try:
            if jobs[0].op is Op.DELETE:
                job = jobs[0]
                return [WriteDone(job, deleted=self._store.delete(job.keys, job.tenant))]
            keys = [key for job in jobs for key in job.keys]
            records = [record for job in jobs for record in job.records]
            client_keys = [key for job in jobs for key in job.client_keys]
            stored = self._store.put(keys, records, jobs[0].tenant, client_keys)
            self._commits += 1
            self._committed_requests += len(jobs)
        except Exception as exc:  # the thread must outlive any failure; the jobs get INTERNAL
            logger.exception("write of %d requests failed", len(jobs))
            self._failures += 1
            return [WriteDone(job, error=f"write failed: {exc!r:.200}") for job in jobs]
        out: list[WriteDone] = []
        offset = 0
        for job in jobs:
            out.append(WriteDone(job, stored=tuple(stored[offset : offset + len(job.keys)])))
            offset += len(job.keys)
        return out


def _bad_record(job: WriteJob) -> str:
    """Why a PUT's record fails its check against its client key ("" when all pass)."""
    for i, (key, record) in enumerate(zip(job.client_keys, job.records, strict=False)):
        verdict = check_record(record, key)
        if verdict is not Verdict.OK:
            return f"page record {i} fails its check: {verdict.value}"
    return ""
