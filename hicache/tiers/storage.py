"""The storage tier: page writes after backups, prefetches, lookups, removals.

``StorageTier`` owns the storage I/O workers (and through them the backend),
the puts in flight, the prefetches (per request and per job), the lookups
that ``match_prefix(with_storage=True)`` starts and the leading-hit counts
they found, and the job that drains the backend's removal journal.

No backend call ever runs on the owner thread: every lookup, get, put and
journal drain is a job on the I/O workers. Owner thread only; completed
jobs come back from ``poll()`` as ``PutDone``/``PrefetchDone``/
``LookupDone``/``StorageRemoved``/``WaitTimedOut`` records for the façade to route. Host pins
are the host tier's: a job carries the pin id it was given.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

import torch

from hicache.events.kv import BlockStored
from hicache.policies.prefetch import PrefetchPolicy, StoragePlan
from hicache.policies.rates import Clock
from hicache.tiers.records import (
    Arrived,
    LookupDone,
    PrefetchDone,
    PrefetchState,
    PutDone,
    StorageRemoved,
    WaitTimedOut,
)
from hicache.tiers.results import PrefetchStatus
from hicache.tree.errors import CacheError
from hicache.tree.radix_tree import Key
from transfer.storage_io import ReadProgress, StorageCompletion, StorageIO, StorageJob, leading

logger = logging.getLogger("hicache.cache")

StorageRecord = PutDone | PrefetchDone | LookupDone | StorageRemoved | WaitTimedOut
LOOKUP_MEMORY = 4096  # lookups whose result is remembered for match_prefix
PREFETCH_PIECES = 8  # a prefetch reads in up to this many pieces (what a cut keeps)
PIECE_BYTES = 256 << 10  # and no piece under this (a call costs a round trip)


class StorageTier:
    """Storage I/O for the cache (see the module docstring)."""

    def __init__(
        self, io: StorageIO, page_size: int, timeout_s: float = 5.0, clock: Clock = time.monotonic
    ) -> None:
        self.io = io
        self.page_size = page_size
        self.timeout_s = timeout_s  # the bound of every wait (storage.timeout_s)
        self.clock = clock
        self._puts: dict[int, tuple[int, BlockStored | None]] = {}  # job -> (pin, event)
        self._prefetches: dict[str, PrefetchState] = {}  # request id -> prefetch
        self._prefetch_jobs: dict[int, PrefetchState] = {}  # job -> prefetch in flight
        self._lookups: dict[int, bytes] = {}  # job -> first key looked up
        self._looking: set[bytes] = set()
        self._found: OrderedDict[bytes, int] = OrderedDict()  # first key -> leading pages
        self._removal_job: int | None = None

    # puts ----------------------------------------------------------------
    def put(
        self, keys: list[bytes], host_slots: torch.Tensor, pin: int, event: BlockStored | None
    ) -> None:
        """Write pages to storage, async; ``pin`` keeps their host copy meanwhile.
        ``event`` (built now: a split before the ack would change the node) is
        handed back in ``PutDone``."""
        job = self.io.submit(StorageJob("put", tuple(keys), host_slots))
        self._puts[job] = (pin, event)

    # lookups ---------------------------------------------------------------
    def known_hits(self, keys: list[bytes]) -> int:
        """Leading pages of ``keys`` that a completed lookup found (0 if none
        completed yet); starts a lookup when none is known or running."""
        if not keys:
            return 0
        first = keys[0]
        found = self._found.get(first)
        if found is not None:
            self._found.move_to_end(first)
            return found
        if first not in self._looking:
            self._looking.add(first)
            self._lookups[self.io.submit(StorageJob("lookup", tuple(keys)))] = first
        return 0

    def _remember(self, first: bytes, found: int) -> None:
        self._found[first] = found
        self._found.move_to_end(first)
        while len(self._found) > LOOKUP_MEMORY:
            self._found.popitem(last=False)

    # prefetches ------------------------------------------------------------
    def has_prefetch(self, request_id: str) -> bool:
        return request_id in self._prefetches

    def start_prefetch(
        self,
        request_id: str,
        key: Key,
        namespace: str | None,
        start: int,
        keys: list[bytes],
        slots: torch.Tensor,
        pin: int,
        min_pages: int,
        plan: StoragePlan,
        page_bytes: int,
    ) -> None:
        """Submit lookup-then-get of ``keys`` into the reserved host ``slots``
        as one job; ``pin`` keeps the prefix the pages hang from; ``plan`` says
        how many found pages to read, in pieces of at least ``PIECE_BYTES``."""
        progress = ReadProgress(self.clock)
        piece = max(-(-len(keys) // PREFETCH_PIECES), -(-PIECE_BYTES // max(page_bytes, 1)))
        job_spec = StorageJob(
            "prefetch", tuple(keys), slots, max(min_pages, 1), plan.pages, progress, piece
        )
        job = self.io.submit(job_spec)
        state = PrefetchState(
            request_id, key, namespace, start, keys, slots, job, pin, self.clock(), plan, progress
        )
        self._prefetches[request_id] = state
        self._prefetch_jobs[job] = state

    def prefetch(self, request_id: str) -> PrefetchState:
        """The request's prefetch; CacheError if it has none."""
        state = self._prefetches.get(request_id)
        if state is None:
            raise CacheError(f"no prefetch for request {request_id!r}")
        return state

    def status(
        self, state: PrefetchState, policy: PrefetchPolicy, budget_s: float
    ) -> PrefetchStatus:
        """Where ``state`` stands under ``policy``: its budget is the plan's
        deadline when it has one (else ``budget_s``, the ``timeout`` budget).
        Tokens fetched count what has arrived so far."""
        view, ps = state.progress.view(), self.page_size
        choice = state.choice
        if choice is None:
            choice = state.plan.choice(view.found if view.found >= 0 else len(state.keys))
            state.choice = choice if view.found >= 0 else None
        budget = budget_s if choice.deadline_s is None else choice.deadline_s
        waited = self.clock() - state.started
        ready = policy.ready(state.done, waited, budget)
        fetched = state.fetched if state.done else view.arrived * ps
        wait_s = 0.0
        if not ready:  # until the budget runs out, or (wait_complete) the bound of every wait
            ends = policy.ready(False, budget, budget)
            wait_s = max(budget - waited, 0.0) if ends else self.timeout_s
        return PrefetchStatus(ready, state.done, fetched, len(state.keys) * ps, wait_s)

    def take_arrived(self, request_id: str, cut: bool) -> Arrived:
        """The request goes on before its prefetch is done: the pages that have
        arrived and were not taken yet are handed over; with ``cut`` the read
        stops after the piece in flight."""
        state = self.prefetch(request_id)
        progress = state.progress
        view = progress.cut() if cut else progress.view()
        lo, hi = state.taken, max(view.arrived * self.page_size, state.taken)
        state.taken, state.cut = hi, state.cut or cut
        seconds = 0.0
        if cut and view.started is not None:
            seconds = max(self.clock() - view.started, 0.0)
        return Arrived(state, lo, hi, cut, view.nbytes, seconds)

    def release(self, request_id: str) -> None:
        """The request stops waiting; a job still running lands anyway."""
        self.prefetch(request_id).released = True
        del self._prefetches[request_id]

    def reserved(self) -> int:
        """Host slots reserved by prefetch jobs in flight (less what they handed
        to the tree early)."""
        return sum(p.host_slots.numel() - p.taken for p in self._prefetch_jobs.values())

    def prefetch_job(self, request_id: str) -> int | None:
        """The job of ``request_id``'s prefetch if it is still in flight."""
        state = self.prefetch(request_id)
        return state.job_id if state.job_id in self._prefetch_jobs else None

    # completions -----------------------------------------------------------
    def poll(self) -> list[StorageRecord]:
        """Finished jobs, without blocking; keeps one journal drain in flight."""
        out = [r for done in self.io.poll() if (r := self._finish(done)) is not None]
        if self._removal_job is None:
            self._removal_job = self.io.submit(StorageJob("removed", ()))
        return out

    def wait(
        self, job_id: int, timeout_s: float | None = None, quiet: bool = False
    ) -> list[StorageRecord]:
        """Wait for one job, at most ``timeout_s`` (default ``self.timeout_s``).
        A job that does not finish in time is given up on, not cancelled: it
        stays in flight (its host pages pinned or reserved, since the worker
        may still use them) and lands in a later ``poll()``. ``quiet``: the
        caller chose a short bound; running past it is no ``WaitTimedOut``."""
        got = self.io.wait(job_id, self.timeout_s if timeout_s is None else timeout_s)
        if got is None and quiet:
            return []
        if got is None:
            logger.warning("storage job %d still running; not waiting longer", job_id)
            return [WaitTimedOut(job_id)]
        done = self._finish(got)
        return [] if done is None else [done]

    def drain(self) -> list[StorageRecord]:
        """Wait for every job in flight (puts, prefetches, lookups, journal),
        all together at most ``timeout_s``; see ``wait`` for jobs that overrun."""
        deadline = time.monotonic() + self.timeout_s
        pending = [*self._puts, *self._prefetch_jobs, *self._lookups]
        if self._removal_job is not None:
            pending.append(self._removal_job)
        out: list[StorageRecord] = []
        for job in pending:
            out += self.wait(job, max(0.0, deadline - time.monotonic()))
        # Then the journal once more: the puts just waited for may have evicted.
        if self._removal_job is None:
            self._removal_job = self.io.submit(StorageJob("removed", ()))
            out += self.wait(self._removal_job, max(0.0, deadline - time.monotonic()))
        return out

    def in_flight(self) -> int:
        """Jobs whose host pages a worker may still read or write."""
        return len(self._puts) + len(self._prefetch_jobs)

    def _finish(self, done: StorageCompletion) -> StorageRecord | None:
        if done.job_id in self._puts:
            pin, event = self._puts.pop(done.job_id)
            ok = done.error is None and all(done.results)
            if not ok:
                logger.debug("storage put %d incomplete: %s", done.job_id, done.error)
            stored = leading(done.results)
            return PutDone(done.job_id, pin, event, stored, ok, done.nbytes, done.timings)
        if done.job_id in self._prefetch_jobs:
            state = self._prefetch_jobs.pop(done.job_id)
            got = leading(done.results)
            state.fetched, state.done = got * self.page_size, True
            if done.found:
                self._remember(state.keys[0], done.found)
            ok = done.error is None
            return PrefetchDone(state, done.found, got, done.nbytes, ok, done.timings, done.planned)
        if done.job_id in self._lookups:
            first = self._lookups.pop(done.job_id)
            self._looking.discard(first)
            if done.error is None:
                self._remember(first, done.found)
            return LookupDone(first, done.found, done.timings)
        if done.job_id == self._removal_job:
            self._removal_job = None
            return StorageRemoved(done.removed)
        logger.warning("completion for unknown storage job %d", done.job_id)
        return None

    def close(self) -> None:
        """Finish queued jobs, stop the workers, close the backend; gives up on
        workers still busy after ``timeout_s`` (the backend then stays open)."""
        self.io.close(self.timeout_s)

    def check(self) -> None:
        """Assert the prefetch tables agree with each other."""
        for job, state in self._prefetch_jobs.items():
            assert state.job_id == job and not state.done, "a finished prefetch is in flight"
            assert 0 <= state.taken <= state.host_slots.numel(), "a prefetch took what it had not"
            assert state.taken % self.page_size == 0, "a prefetch took part of a page"
            live = self._prefetches.get(state.request_id)
            assert live is state or state.released, "a prefetch job lost its request"
        for state in self._prefetches.values():
            assert state.done or state.job_id in self._prefetch_jobs, "a prefetch has no job"
        assert set(self._lookups.values()) == self._looking, "lookup tables disagree"


def prefetch_outcome(done: PrefetchDone, page_size: int, threshold: int) -> str:
    """One outcome per finished prefetch; only ``failed`` is a fault (a prompt
    storage has never seen is a ``miss``, the healthy common case; ``declined``:
    the policy judged recomputing faster than reading what storage held)."""
    got = done.fetched_pages * page_size
    if got:
        return "complete" if got == done.state.host_slots.numel() else "partial"
    if not done.ok:
        return "failed"
    if done.found_pages == 0:
        return "miss"
    if done.found_pages * page_size < threshold:
        return "below_threshold"
    if done.planned_pages == 0 or done.state.cut:
        return "declined"
    return "failed"  # storage listed the pages but none could be read
