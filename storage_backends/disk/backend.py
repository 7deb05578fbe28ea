"""DiskBackend: page records in segment files, located through an LMDB index.

A put reserves slots in one index transaction (evicting least recently used
pages for room), writes the records with one ``pwritev`` per run of adjacent slots
(``runs``) on the I/O pool, then
commits the batch's index entries in a second, small transaction: a crash in
between leaves reserved slots that no key points at (reclaimed once their
process is gone), never a key pointing at half a page. A get looks the batch
up in one read transaction, reads each record with ``preadv`` straight into the
caller's buffers and checks the header's key and the xxh3 checksum; a mismatch
(a slot reused by another process meanwhile, a torn or damaged record) is a
miss, and the key is dropped once a second read confirms the damage.
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import lmdb

from storage_backends.base import StorageStats
from storage_backends.batch import byte_view, check_batch, check_keys
from storage_backends.config import StorageConfig
from storage_backends.counters import StatCounters
from storage_backends.disk.index import DiskIndex, IndexWriter, Owner, Reserved
from storage_backends.disk.io_pool import IoPool
from storage_backends.disk.layout import INDEX_DIR, Location, Slot, SlotClass, slot_class
from storage_backends.disk.owners import Ownership
from storage_backends.disk.records import check_read
from storage_backends.disk.runs import Extent, Run, gap, plan_runs
from storage_backends.disk.segments import SegmentFiles, check_direct_io
from storage_backends.errors import StorageClosedError, StoreDamagedError
from storage_backends.lmdb_check import check_store
from storage_backends.log_limit import LogLimiter
from storage_backends.page_format import HEADER_BYTES, Verdict, build_header
from storage_backends.recency import FLUSH_AT, PendingTouches
from storage_backends.store_dir import prepare_store_dir, quarantine_store

logger = logging.getLogger(__name__)

# Recency updates from gets ride on the next put's transaction, or get one of
# their own once this many have piled up.
# The index's structural check reads every B-tree page of the index (~170 bytes a
# page of data): seconds for millions of pages. Its time limit grows with the index,
# read at a pace any disk keeps, so that running out of time means a check that is
# stuck, not an index that is merely large.
_MIN_CHECK_S = 60.0
_CHECK_BYTES_PER_S = 16 << 20


class PutPhase(enum.Enum):
    """Points of a put where ``DiskBackend.fault_hook`` is called (crash tests)."""

    BEFORE_DATA = "before_data"  # slots reserved and committed, no record written
    AFTER_DATA = "after_data"  # records written, their index entries not committed
    IN_COMMIT = "in_commit"  # inside the index transaction, before it commits


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


class _Plan(NamedTuple):
    results: list[bool]
    writes: list[_Planned]
    evictions: int
    owner: Owner


class _Read(NamedTuple):
    pos: int
    location: Location


class DiskBackend:
    """The ``disk`` backend (see the module docstring and DESIGN §11).

    Thread-safe as the protocol asks; several processes may share one store path (one
    DiskBackend per path per process: an LMDB rule).
    Unlike the in-memory backends, a get reads into ``dst`` before checking it:
    a damaged page's buffer may have been written, but it is reported as a miss.
    ``fault_hook`` (None in use) is called with each ``PutPhase`` of a put.
    """

    def __init__(self, config: StorageConfig) -> None:
        self._config = config
        self._counters = StatCounters()
        self._log = LogLimiter(logger)
        root = prepare_store_dir(config)
        if config.direct_io:
            check_direct_io(root)  # before anything is opened that would need closing
        self._root, self._owners, self._index = self._open(root)
        file_bytes = min(self._index.segment_bytes, config.max_bytes)
        self._segments = SegmentFiles(self._root, file_bytes, config.direct_io)
        self._pool = IoPool(config.io_threads)
        self._write_lock = threading.Lock()
        self._touches = PendingTouches()
        self._closed = False
        self._pid = os.getpid()
        self._batches = itertools.count()
        self.fault_hook: Callable[[PutPhase], None] | None = None

    # -- opening -------------------------------------------------------------------------

    def _open(self, root: Path) -> tuple[Path, Ownership, DiskIndex]:
        owners = Ownership(root, self._config.timeout_s)
        index_dir = root / INDEX_DIR
        damage = None
        if owners.alone and not owners.closed_cleanly(index_dir / "data.mdb"):
            damage = check_store(index_dir, self._check_limit(index_dir)).damage
        try:
            if damage is not None:
                raise StoreDamagedError(damage)
            index = DiskIndex(index_dir, self._config)
        except StoreDamagedError as exc:
            owners.release(None)
            root = self._quarantine(root, str(exc))
            owners = Ownership(root, self._config.timeout_s)
            index = DiskIndex(root / INDEX_DIR, self._config)
        except BaseException:
            owners.release(None)
            raise
        owners.opened()
        self._reclaim(index, owners.alone)
        return root, owners, index

    def _check_limit(self, index_dir: Path) -> float:
        try:
            size = (index_dir / "data.mdb").stat().st_size
        except OSError:
            size = 0
        return max(_MIN_CHECK_S, self._config.timeout_s, size / _CHECK_BYTES_PER_S)

    def _reclaim(self, index: DiskIndex, alone: bool) -> None:
        """Free slots reserved by puts whose process died before committing them."""
        try:
            with index.writing() as writer:
                reclaimed = writer.reclaim_pending(False if alone else None)
        except lmdb.Error:
            logger.warning("could not reclaim reserved slots of %s", index.path, exc_info=True)
            return
        if reclaimed:
            logger.info("reclaimed %d slots left reserved by crashed writers", reclaimed)

    def _quarantine(self, root: Path, damage: str) -> Path:
        moved = quarantine_store(root)
        logger.error(
            "disk store %s is damaged (%s); moved to %s, starting empty", root, damage, moved
        )
        self._counters.record_quarantine()
        return prepare_store_dir(self._config)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError("DiskBackend is closed")

    # -- reads ---------------------------------------------------------------------------

    def exists(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        return self._index.count_leading(keys)

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        self._check_open()
        check_keys(keys)
        return self._index.contains(keys)

    def sizes(self, keys: Sequence[bytes]) -> list[int | None]:
        """Each key's stored payload length, None when absent (one index read, no data
        read, mutates nothing): what a reader that does not know the page sizes (the
        daemon) allocates before ``get``. A page replaced meanwhile is a miss of ``get``."""
        self._check_open()
        check_keys(keys)
        return self._index.payload_sizes(keys)

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        self._check_open()
        views = check_batch(keys, dst, writable=True)
        return self._read(keys, [[view] for view in views])

    def get_scatter(self, keys: Sequence[bytes], dst: list[Sequence[memoryview]]) -> list[bool]:
        """Read each key's payload into the runs ``dst[i]``, in order (their lengths must
        add up to the stored payload length, else a miss). As ``get`` otherwise."""
        self._check_open()
        if len(keys) != len(dst):
            raise ValueError(f"got {len(keys)} keys but {len(dst)} destinations")
        check_keys(keys)
        runs = [[byte_view(run, writable=True) for run in runs] for runs in dst]
        return self._read(keys, runs)

    def _read(self, keys: Sequence[bytes], runs: list[list[memoryview]]) -> list[bool]:
        lookup = self._index.lookup(keys)
        reads = [
            _Read(i, loc)
            for i, loc in enumerate(lookup.locations)
            if loc is not None and loc.payload_len == sum(len(run) for run in runs[i])
        ]
        verdicts = self._pool.map(
            lambda r: self._read_one(keys[r.pos], r.location, runs[r.pos]), reads
        )
        hits = [False] * len(keys)
        damaged: list[tuple[bytes, Location | None]] = [(keys[i], None) for i in lookup.damaged]
        for read, verdict in zip(reads, verdicts, strict=True):
            hits[read.pos] = verdict is Verdict.OK
            if verdict.corrupt:
                damaged.append((keys[read.pos], read.location))
        corrupt = self._drop_damaged(damaged) if damaged else 0
        n_hits = sum(hits)
        self._counters.record_get(n_hits, len(keys) - n_hits, corrupt)
        self._touch([key for key, hit in zip(keys, hits, strict=True) if hit])
        return hits

    def _read_one(self, key: bytes, loc: Location, runs: Sequence[memoryview]) -> Verdict:
        header = bytearray(HEADER_BYTES)
        try:
            got = self._segments.read(loc.segment, loc.offset, [header, *runs])
        except OSError as exc:
            self._log.failure("disk store read failed; reported as a damaged page", exc)
            return Verdict.TRUNCATED
        return check_read(header, key, got, runs)

    def _drop_damaged(self, damaged: list[tuple[bytes, Location | None]]) -> int:
        """Delete pages found damaged whose entry still points where they were read and
        whose record fails a second read (a slot reused meanwhile is not damage)."""
        try:
            with self._write_lock, self._index.writing() as writer:
                dropped = sum(self._drop_one(writer, key, loc) for key, loc in damaged)
        except lmdb.Error:
            logger.exception("could not delete %d damaged pages", len(damaged))
            return 0
        self._counters.note_removed(writer.removed)
        if dropped:
            logger.warning("deleted %d damaged pages from %s", dropped, self._root)
        return dropped

    def _drop_one(self, writer: IndexWriter, key: bytes, seen: Location | None) -> bool:
        current = writer.location(key)
        if seen is not None:
            if current is None or current._replace(stamp=0) != seen._replace(stamp=0):
                return False
            scratch = memoryview(bytearray(seen.payload_len))
            if self._read_one(key, seen, [scratch]) is Verdict.OK:
                return False
        return writer.remove(key)

    def _touch(self, keys: list[bytes]) -> None:
        """Queue recency updates; flush them now only if many are pending and no write runs."""
        if not keys:
            return
        if self._touches.add(keys) >= FLUSH_AT and self._write_lock.acquire(blocking=False):
            try:
                with self._index.writing() as writer:
                    for key in self._touches.take():
                        writer.touch(key)
            except lmdb.Error:
                logger.exception("dropped recency updates")
            finally:
                self._write_lock.release()

    # -- writes --------------------------------------------------------------------------

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        self._check_open()
        views = check_batch(keys, src, writable=False)
        if not views:
            return []
        with self._write_lock:
            self._check_open()
            plan = self._reserve(keys, views)
        stored = 0
        if plan.writes:
            self._fault(PutPhase.BEFORE_DATA)
            written = self._write(plan.writes)
            self._fault(PutPhase.AFTER_DATA)
            with self._write_lock:
                stored = self._commit(plan, written)
        failures = plan.results.count(False)
        self._counters.record_put(stored, failures, plan.evictions)
        return plan.results

    def _fault(self, phase: PutPhase) -> None:
        if self.fault_hook is not None:
            self.fault_hook(phase)

    def _reserve(self, keys: Sequence[bytes], views: list[memoryview]) -> _Plan:
        """Transaction 1: queued touches, then reserved slots for the new pages."""
        results = [False] * len(keys)
        owner = Owner(self._pid, next(self._batches))
        try:
            with self._index.writing() as writer:
                for key in self._touches.take():
                    writer.touch(key)
                new = self._new_pages(writer, keys, views, results)
                kept, given_up = self._fitting(new)
                writes = self._reserve_slots(writer, kept)
                writer.pend(owner, [Reserved(w.slot, w.cls) for w in writes])
        except lmdb.Error as exc:
            self._log.failure("disk store index is full or failing; puts refused", exc)
            return _Plan([False] * len(keys), [], 0, owner)
        self._counters.note_removed(writer.removed + [page.key for page in given_up])
        for page in given_up:
            results[page.pos] = True
        return _Plan(results, writes, writer.evictions + len(given_up), owner)

    def _new_pages(
        self,
        writer: IndexWriter,
        keys: Sequence[bytes],
        views: list[memoryview],
        results: list[bool],
    ) -> list[_Page]:
        """The batch's pages not stored yet (present ones are touched and reported stored)."""
        seen: set[bytes] = set()
        new: list[_Page] = []
        for i, (key, view) in enumerate(zip(keys, views, strict=True)):
            if key in seen or writer.has(key):
                writer.touch(key)
                results[i] = True  # a duplicate in the batch: the first one decides
                continue
            seen.add(key)
            record = HEADER_BYTES + len(view)
            if len(view) <= self._config.max_page_bytes and record <= self._config.max_bytes:
                new.append(_Page(i, key, view))
        return new

    def _fitting(self, pages: list[_Page]) -> tuple[list[_Page], list[_Page]]:
        """(the last pages whose records fit ``max_bytes`` together, the earlier ones): a
        batch larger than the store keeps its newest pages, as if the older ones had been
        stored and evicted."""
        total = 0
        for n in range(len(pages) - 1, -1, -1):
            total += HEADER_BYTES + len(pages[n].view)
            if total > self._config.max_bytes:
                return pages[n + 1 :], pages[: n + 1]
        return pages, []

    def _reserve_slots(self, writer: IndexWriter, pages: list[_Page]) -> list[_Planned]:
        """Slots for ``pages``, one run per size class; pages left without one fail."""
        by_len: dict[int, list[_Page]] = {}  # a batch usually holds one page size
        for page in pages:
            by_len.setdefault(len(page.view), []).append(page)
        by_class: dict[SlotClass, list[_Page]] = {}
        for length, group in by_len.items():
            by_class.setdefault(slot_class(length, self._config.direct_io), []).extend(group)
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
        (data fsynced first at ``sync = "full"``)."""
        extents = [
            Extent(w.slot.segment, w.slot.offset, HEADER_BYTES + len(w.view), w.cls.stride)
            for w in writes
        ]
        planned = plan_runs(extents, 3, self._config.io_threads)  # header, payload, gap
        grown = self._grow(planned, extents)
        outcomes = self._pool.map(lambda run: self._write_run(run, writes), grown)
        result = [False] * len(writes)
        for run, fine in zip(grown, outcomes, strict=True):
            for member in run.members:
                result[member] = fine
        if self._config.sync_level.fsync_data and any(result):
            try:
                self._segments.sync()
            except OSError as exc:
                self._log.failure("disk store fsync failed; the batch is not stored", exc)
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
                self._segments.reserve(segment, end)
            except OSError as exc:
                self._log.failure("disk store segment cannot grow (disk full?)", exc)
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
            self._segments.write(run.segment, run.offset, bufs)
        except OSError as exc:
            self._log.failure("disk store write failed; the pages are not stored", exc)
            return False
        return True

    def _commit(self, plan: _Plan, written: list[bool]) -> int:
        """Transaction 2: the written pages' index entries; failed slots go back."""
        stored = 0
        try:
            with self._index.writing() as writer:
                self._fault(PutPhase.IN_COMMIT)
                writer.settle(plan.owner)
                done = [w for w, ok in zip(plan.writes, written, strict=True) if ok]
                added = writer.insert_new(done)
                stored = sum(added)
                # Slots of failed writes, and of pages another process stored meanwhile.
                unused = [w for w, ok in zip(plan.writes, written, strict=True) if not ok]
                unused += [w for w, fresh in zip(done, added, strict=True) if not fresh]
                for w in unused:
                    writer.alloc.release(w.slot, w.cls)
                for w, ok in zip(plan.writes, written, strict=True):
                    plan.results[w.pos] = ok
        except lmdb.Error as exc:
            self._log.failure("disk store index commit failed; the batch is not stored", exc)
            for w in plan.writes:
                plan.results[w.pos] = False
            return 0
        return stored

    # -- the rest ------------------------------------------------------------------------

    def delete(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        try:
            with self._write_lock, self._index.writing() as writer:
                removed = sum(writer.remove(key) for key in keys)
        except lmdb.Error:
            logger.exception("disk store delete of %d pages failed", len(keys))
            return 0
        self._counters.note_removed(writer.removed)
        self._counters.record_deletes(removed)
        return removed

    def take_removed(self) -> list[bytes]:
        return self._counters.take_removed()

    def stats(self) -> StorageStats:
        self._check_open()
        entries, bytes_used = self._index.size()
        return self._counters.snapshot(entries, bytes_used, self._config.max_bytes)

    def close(self) -> None:
        with self._write_lock:
            if self._closed:
                return
            self._closed = True
            self._pool.close()
            clean = self._close_index()
            self._segments.close()
            self._owners.release(self._index.data_file() if clean else None)

    def _close_index(self) -> bool:
        """Apply queued touches, sync and close the index; whether it closed sound."""
        clean = not self._index.damaged
        try:
            if clean:
                with self._index.writing() as writer:
                    for key in self._touches.take():
                        writer.touch(key)
                self._index.sync()
        except (lmdb.Error, StoreDamagedError):
            logger.exception("closing the disk store index of %s", self._root)
            clean = False
        finally:
            self._index.close()
        return clean
