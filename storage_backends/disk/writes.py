"""The disk backend's put path: one index write transaction a batch.

Inside one LMDB write transaction a put applies the queued recency touches, skips
the pages stored already, takes slots for the new ones (evicting least recently
used pages for room), writes the records with one ``pwritev`` per run of adjacent
slots (``runs``) on the I/O pool, adds the written pages' index entries and
commits. Until the commit nothing of the batch exists: a crash anywhere before it
leaves the index as it was, so there is nothing to reclaim and no key can point at
half a page. The slots the batch wrote were free then, or held pages this
transaction evicted; those pages' entries survive the crash and point at another
key's record, which every read detects (header key, checksum): a miss, and the key
is dropped.

The price: the transaction holds LMDB's writer lock (shared by every process on
the store) while the batch's records are written, so another writer waits for this
batch's I/O, not only for its index work.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import lmdb

from storage_backends.config import StorageConfig
from storage_backends.counters import StatCounters
from storage_backends.disk.index import DiskIndex, IndexWriter
from storage_backends.disk.io_pool import IoPool
from storage_backends.disk.layout import Slot, SlotClass, slot_class
from storage_backends.disk.runs import Extent, Run, gap, plan_runs
from storage_backends.disk.segments import SegmentFiles
from storage_backends.log_limit import LogLimiter
from storage_backends.page_format import HEADER_BYTES, build_header
from storage_backends.recency import PendingTouches

logger = logging.getLogger(__name__)


class PutPhase(enum.Enum):
    """Points of a put where the fault hook is called (crash tests); all of them lie
    inside the batch's one index transaction."""

    BEFORE_DATA = "before_data"  # slots taken, no record written
    AFTER_DATA = "after_data"  # records written, their index entries not added
    IN_COMMIT = "in_commit"  # index entries added, the transaction not committed


FaultHook = Callable[[PutPhase], None]


@dataclass(frozen=True)
class WriteContext:
    """What the put path shares with the rest of its DiskBackend."""

    config: StorageConfig
    index: DiskIndex
    segments: SegmentFiles
    pool: IoPool
    counters: StatCounters
    log: LogLimiter
    touches: PendingTouches
    write_lock: threading.Lock  # serialises this process's index write transactions


class _Page(NamedTuple):
    pos: int  # position in the batch
    key: bytes
    view: memoryview


class _Planned(NamedTuple):
    pos: int  # position in the batch
    key: bytes
    view: memoryview
    slot: Slot
    cls: SlotClass

    @property
    def payload_len(self) -> int:
        return len(self.view)


class _Outcome(NamedTuple):
    results: list[bool]
    stored: int  # pages newly indexed
    evictions: int
    removed: list[bytes]  # keys evicted, or given up as if stored and evicted


class DiskWrites:
    """``put`` of one DiskBackend.

    Thread-safe as its caller holds ``write_lock`` around ``put_locked`` (and checks,
    under it, that the backend is open). Mutates the
    index, the segment files, the counters and the touch queue. Raises nothing for
    I/O or index failures (the pages are reported not stored); ValueError comes from
    the caller's argument checks, before any of this.
    """

    def __init__(self, ctx: WriteContext) -> None:
        self._ctx = ctx
        self.fault_hook: FaultHook | None = None

    def put_locked(self, keys: Sequence[bytes], views: list[memoryview]) -> list[bool]:
        """Store a checked, non-empty batch; the caller holds ``write_lock``."""
        try:
            with self._ctx.index.writing() as writer:
                outcome = self._put_in(writer, keys, views)
        except lmdb.Error as exc:
            self._ctx.log.failure("disk store index full or failing; batch not stored", exc)
            self._ctx.counters.record_put(0, len(keys), 0)
            return [False] * len(keys)
        self._ctx.counters.note_removed(outcome.removed)
        failures = outcome.results.count(False)
        self._ctx.counters.record_put(outcome.stored, failures, outcome.evictions)
        return outcome.results

    def _fault(self, phase: PutPhase) -> None:
        if self.fault_hook is not None:
            self.fault_hook(phase)

    def _put_in(
        self, writer: IndexWriter, keys: Sequence[bytes], views: list[memoryview]
    ) -> _Outcome:
        """The batch inside ``writer``'s transaction (committed by the caller)."""
        results = [False] * len(keys)
        for key in self._ctx.touches.take():
            writer.touch(key)
        new = self._new_pages(writer, keys, views, results)
        kept, given_up = self._fitting(new)
        for page in given_up:
            results[page.pos] = True
        writes = self._reserve_slots(writer, kept)
        stored = 0
        if writes:
            self._fault(PutPhase.BEFORE_DATA)
            written = self._write(writes)
            self._fault(PutPhase.AFTER_DATA)
            stored = self._index_written(writer, writes, written, results)
            self._fault(PutPhase.IN_COMMIT)
        removed = writer.removed + [page.key for page in given_up]
        return _Outcome(results, stored, writer.evictions + len(given_up), removed)

    def _new_pages(
        self,
        writer: IndexWriter,
        keys: Sequence[bytes],
        views: list[memoryview],
        results: list[bool],
    ) -> list[_Page]:
        """The batch's pages not stored yet (present ones are touched and reported stored)."""
        config = self._ctx.config
        seen: set[bytes] = set()
        new: list[_Page] = []
        for i, (key, view) in enumerate(zip(keys, views, strict=True)):
            if key in seen or writer.has(key):
                writer.touch(key)
                results[i] = True  # a duplicate in the batch: the first one decides
                continue
            seen.add(key)
            if len(view) <= config.max_page_bytes and HEADER_BYTES + len(view) <= config.max_bytes:
                new.append(_Page(i, key, view))
        return new

    def _fitting(self, pages: list[_Page]) -> tuple[list[_Page], list[_Page]]:
        """(the last pages whose records fit ``max_bytes`` together, the earlier ones): a
        batch larger than the store keeps its newest pages, as if the older ones had been
        stored and evicted."""
        total = 0
        for n in range(len(pages) - 1, -1, -1):
            total += HEADER_BYTES + len(pages[n].view)
            if total > self._ctx.config.max_bytes:
                return pages[n + 1 :], pages[: n + 1]
        return pages, []

    def _reserve_slots(self, writer: IndexWriter, pages: list[_Page]) -> list[_Planned]:
        """Slots for ``pages``, one run per size class; pages left without one fail."""
        by_len: dict[int, list[_Page]] = {}  # a batch usually holds one page size
        for page in pages:
            by_len.setdefault(len(page.view), []).append(page)
        by_class: dict[SlotClass, list[_Page]] = {}
        for length, group in by_len.items():
            by_class.setdefault(slot_class(length, self._ctx.config.direct_io), []).extend(group)
        writes: list[_Planned] = []
        for cls, group in by_class.items():
            records = HEADER_BYTES * len(group) + sum(len(page.view) for page in group)
            slots = writer.reserve(cls, len(group), records)
            writes += [
                _Planned(p.pos, p.key, p.view, s, cls)
                for p, s in zip(group[: len(slots)], slots, strict=True)
            ]
        return writes

    def _write(self, writes: list[_Planned]) -> list[bool]:
        """The records, one ``pwritev`` per run of adjacent slots, runs on the I/O pool
        (data fsynced at ``sync = "full"``, before the index commits)."""
        extents = [
            Extent(w.slot.segment, w.slot.offset, HEADER_BYTES + len(w.view), w.cls.stride)
            for w in writes
        ]
        planned = plan_runs(extents, 3, self._ctx.config.io_threads)  # header, payload, gap
        grown = self._grow(planned, extents)
        outcomes = self._ctx.pool.map(lambda run: self._write_run(run, writes), grown)
        result = [False] * len(writes)
        for run, fine in zip(grown, outcomes, strict=True):
            for member in run.members:
                result[member] = fine
        if self._ctx.config.sync_level.fsync_data and any(result):
            try:
                self._ctx.segments.sync()
            except OSError as exc:
                self._ctx.log.failure("disk store fsync failed; the batch is not stored", exc)
                return [False] * len(writes)
        return result

    def _grow(self, runs: list[Run], extents: list[Extent]) -> list[Run]:
        """Allocate file blocks under the runs' slots; return the runs whose segment
        could grow (a full disk fails the pages of the others)."""
        ends: dict[int, int] = {}
        for run in runs:
            last = extents[run.members[-1]]
            ends[run.segment] = max(ends.get(run.segment, 0), last.offset + last.stride)
        failed: set[int] = set()
        for segment, end in ends.items():
            try:
                self._ctx.segments.reserve(segment, end)
            except OSError as exc:
                self._ctx.log.failure("disk store segment cannot grow (disk full?)", exc)
                failed.add(segment)
        return [run for run in runs if run.segment not in failed]

    def _write_run(self, run: Run, writes: list[_Planned]) -> bool:
        """Write a run's records (header, payload, zeros up to the next slot)."""
        bufs: list[bytes | memoryview] = []
        for n, member in enumerate(run.members):
            w = writes[member]
            bufs += [build_header(w.key, w.view), w.view]
            record = HEADER_BYTES + len(w.view)
            if n + 1 < len(run.members) and w.cls.stride > record:
                bufs.append(gap(w.cls.stride - record))
        try:
            self._ctx.segments.write(run.segment, run.offset, bufs)
        except OSError as exc:
            self._ctx.log.failure("disk store write failed; the pages are not stored", exc)
            return False
        return True

    def _index_written(
        self,
        writer: IndexWriter,
        writes: list[_Planned],
        written: list[bool],
        results: list[bool],
    ) -> int:
        """Index the written pages; the slots of failed writes go back. Return how many
        pages were indexed."""
        done = [w for w, ok in zip(writes, written, strict=True) if ok]
        added = writer.insert_new(done)
        for w, ok in zip(writes, written, strict=True):
            if not ok:
                writer.alloc.release(w.slot, w.cls)
        for w, fresh in zip(done, added, strict=True):
            results[w.pos] = True
            if not fresh:  # stored meanwhile: not while this transaction holds the lock
                writer.alloc.release(w.slot, w.cls)
        return sum(added)
