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
from collections.abc import Callable, Sequence
from typing import NamedTuple

import lmdb

from storage_backends.disk.index import IndexWriter
from storage_backends.disk.layout import Slot, SlotClass, SlotRun, slot_class
from storage_backends.disk.parts import DiskParts
from storage_backends.disk.room import record_key
from storage_backends.disk.runs import gap, spans
from storage_backends.page_format import HEADER_BYTES, build_header, header_for
from storage_backends.trusted_records import RecordsPut

logger = logging.getLogger(__name__)


class PutPhase(enum.Enum):
    """Points of a put where the fault hook is called (crash tests); all of them lie
    inside the batch's one index transaction."""

    BEFORE_DATA = "before_data"  # slots taken, no record written
    AFTER_DATA = "after_data"  # records written, their index entries not added
    IN_COMMIT = "in_commit"  # index entries added, the transaction not committed


FaultHook = Callable[[PutPhase], None]


class _Page(NamedTuple):
    pos: int  # position in the batch
    key: bytes
    view: memoryview  # the payload
    checksum: int | None  # the payload's xxh3 when the caller verified it (None: hash it)


class _Group(NamedTuple):
    """New pages of one slot class, in batch order."""

    cls: SlotClass
    pages: list[_Page]


class _Span(NamedTuple):
    """Pages whose records go back to back into consecutive slots: one ``pwritev``."""

    segment: int
    offset: int
    cls: SlotClass
    pages: list[_Page]

    @property
    def slots(self) -> SlotRun:
        return SlotRun(self.segment, self.offset, len(self.pages))


class _Marks(NamedTuple):
    """Per position of a batch: stored (now held), and fresh (held as this batch's page)."""

    results: list[bool]
    fresh: list[bool]


class _Outcome(NamedTuple):
    results: list[bool]
    written: list[bool]  # per position: indexed by this batch (not held before, not failed)
    stored: int  # pages newly indexed
    evictions: int
    removed: list[bytes]  # keys evicted, or given up as if stored and evicted


class DiskWrites:
    """``put`` of one DiskBackend.

    Thread-safe as its caller holds ``write_lock`` around ``put_locked`` (and checks,
    under it, that the backend is open). Mutates the index, the segment files, the
    counters and the touch queue. I/O and index failures raise nothing: their pages
    are reported not stored. Structural damage of the index raises StoreDamagedError
    (from ``DiskIndex.writing``); ValueError comes from the caller's argument checks,
    before any of this.
    """

    def __init__(self, ctx: DiskParts) -> None:
        self._ctx = ctx
        self.fault_hook: FaultHook | None = None
        config = ctx.config
        self._fsync_data = config.sync_level.fsync_data
        self._max_payload = min(config.max_page_bytes, config.max_bytes - HEADER_BYTES)

    def put_locked(
        self,
        keys: Sequence[bytes],
        views: list[memoryview],
        checksums: Sequence[int | None] | None = None,
    ) -> RecordsPut:
        """Store a checked, non-empty batch of payloads; the caller holds ``write_lock``.
        ``checksums``: the payloads' xxh3, when the caller verified them (the records'
        headers are then built from them, without hashing the payloads again). Per key:
        whether a page of it is stored now, and whether that page is this batch's."""
        sums = checksums if checksums is not None else [None] * len(keys)
        try:
            with self._ctx.index.writing() as writer:
                outcome = self._put_in(writer, keys, views, sums)
        except lmdb.Error as exc:
            self._ctx.log.failure("disk store index full or failing; batch not stored", exc)
            self._ctx.counters.record_put(0, len(keys), 0)
            return RecordsPut([False] * len(keys), [False] * len(keys))
        if outcome.removed:
            self._ctx.counters.note_removed(outcome.removed)
        failures = outcome.results.count(False)
        self._ctx.counters.record_put(outcome.stored, failures, outcome.evictions)
        return RecordsPut(outcome.results, outcome.written)

    def _fault(self, phase: PutPhase) -> None:
        if self.fault_hook is not None:
            self.fault_hook(phase)

    def _put_in(
        self,
        writer: IndexWriter,
        keys: Sequence[bytes],
        views: list[memoryview],
        sums: Sequence[int | None],
    ) -> _Outcome:
        """The batch inside ``writer``'s transaction (committed by the caller)."""
        writer.touch_many(self._ctx.touches.take())
        if len(keys) == 1:
            return self._put_one(writer, keys[0], views[0], sums[0])
        results = [False] * len(keys)
        fresh = [False] * len(keys)
        new = self._new_pages(writer, keys, views, sums, results)
        kept, given_up = self._fitting(new)
        for page in given_up:
            results[page.pos] = True
        placed = self._place(writer, kept)
        stored = 0
        if placed:
            self._fault(PutPhase.BEFORE_DATA)
            written = self._write(placed)
            self._fault(PutPhase.AFTER_DATA)
            stored = self._index_written(writer, placed, written, _Marks(results, fresh))
            self._fault(PutPhase.IN_COMMIT)
        removed = writer.removed + [page.key for page in given_up] if given_up else writer.removed
        return _Outcome(results, fresh, stored, writer.evictions + len(given_up), removed)

    def _put_one(
        self, writer: IndexWriter, key: bytes, view: memoryview, checksum: int | None
    ) -> _Outcome:
        """``_put_in`` of a batch of one page in fewer steps (no grouping, fitting or
        spans: a third of a one-page put's CPU went to them); the same outcomes."""
        if writer.has(key):
            writer.touch(key)
            return _Outcome([True], [False], 0, writer.evictions, writer.removed)
        if len(view) > self._max_payload:  # a page within it fits max_bytes alone
            return _Outcome([False], [False], 0, writer.evictions, writer.removed)
        cls = slot_class(len(view), self._ctx.config.direct_io)
        runs = writer.reserve(cls, 1, HEADER_BYTES + len(view), self._record_key)
        if not runs:
            return _Outcome([False], [False], 0, writer.evictions, writer.removed)
        placed = [_Span(runs[0].segment, runs[0].offset, cls, [_Page(0, key, view, checksum)])]
        self._fault(PutPhase.BEFORE_DATA)
        written = self._write(placed)
        self._fault(PutPhase.AFTER_DATA)
        marks = _Marks([False], [False])
        stored = self._index_written(writer, placed, written, marks)
        self._fault(PutPhase.IN_COMMIT)
        return _Outcome(marks.results, marks.fresh, stored, writer.evictions, writer.removed)

    def _new_pages(
        self,
        writer: IndexWriter,
        keys: Sequence[bytes],
        views: list[memoryview],
        sums: Sequence[int | None],
        results: list[bool],
    ) -> list[_Page]:
        """The batch's pages not stored yet (present ones are touched and reported stored)."""
        present = writer.present(keys)
        seen: set[bytes] = set()
        new: list[_Page] = []
        for i, key in enumerate(keys):
            if present[i] or key in seen:
                writer.touch(key)
                results[i] = True  # a duplicate in the batch: the first one decides
                continue
            seen.add(key)
            view = views[i]
            if len(view) <= self._max_payload:
                new.append(_Page(i, key, view, sums[i]))
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

    def _place(self, writer: IndexWriter, pages: list[_Page]) -> list[_Span]:
        """Slots for ``pages`` (taken per size class), as spans; pages left without a
        slot are not in any span (they fail)."""
        groups = _groups(pages, self._ctx.config.direct_io)
        taken = self._reserve(writer, groups)
        if len(groups) > 1 and any(
            sum(run.n_slots for run in runs) < len(group.pages)
            for group, runs in zip(groups, taken, strict=True)
        ):
            # The slots of the batch's larger pages may split the space its evictions
            # freed for the smaller ones: give them back (they merge with that space)
            # and place the batch again.
            writer.unreserve([(group.cls, runs) for group, runs in zip(groups, taken, strict=True)])
            taken = self._reserve(writer, groups)
        placed: list[_Span] = []
        for group, runs in zip(groups, taken, strict=True):
            stride, parts = group.cls.stride, self._parts(group)
            for span in spans(runs, stride, 3, parts):  # header, payload, gap a record
                chosen = group.pages[span.first : span.first + span.n_records]
                placed.append(_Span(span.segment, span.offset, group.cls, chosen))
        return placed

    def _parts(self, group: _Group) -> int:
        """How many I/O threads share a group's writes: one per ``SPLIT_BYTES`` of
        payload, at most ``io_threads``."""
        payload = sum(len(page.view) for page in group.pages)
        return max(1, min(self._ctx.config.io_threads, payload // SPLIT_BYTES))

    def _reserve(self, writer: IndexWriter, groups: list[_Group]) -> list[list[SlotRun]]:
        taken: list[list[SlotRun]] = []
        for group in groups:
            records = HEADER_BYTES * len(group.pages) + sum(len(p.view) for p in group.pages)
            taken.append(writer.reserve(group.cls, len(group.pages), records, self._record_key))
        return taken

    def _record_key(self, slot: Slot) -> bytes | None:
        return record_key(self._ctx.segments, slot)

    def _write(self, placed: list[_Span]) -> list[bool]:
        """The spans' records, one ``pwritev`` a span, on the I/O pool (data fsynced at
        ``sync = "full"``, before the index commits)."""
        failed = self._grow(placed)
        result = self._ctx.pool.map(
            lambda span: span.segment not in failed and self._write_span(span), placed
        )
        if self._fsync_data and any(result):
            try:
                self._ctx.segments.sync()
            except OSError as exc:
                self._ctx.log.failure("disk store fsync failed; the batch is not stored", exc)
                return [False] * len(placed)
        return result

    def _grow(self, placed: list[_Span]) -> set[int]:
        """Allocate file blocks under the spans' slots; the segments that could not grow
        (a full disk fails their spans)."""
        ends: dict[int, int] = {}
        for span in placed:
            end = span.offset + len(span.pages) * span.cls.stride
            ends[span.segment] = max(ends.get(span.segment, 0), end)
        failed: set[int] = set()
        for segment, end in ends.items():
            try:
                self._ctx.segments.reserve(segment, end)
            except OSError as exc:
                self._ctx.log.failure("disk store segment cannot grow (disk full?)", exc)
                failed.add(segment)
        return failed

    def _write_span(self, span: _Span) -> bool:
        """Write a span's records (header, payload, zeros up to the next slot); runs on
        the I/O pool, so the checksums are computed there too."""
        stride, last = span.cls.stride, len(span.pages) - 1
        bufs: list[bytes | memoryview] = []
        for n, page in enumerate(span.pages):
            view = page.view
            if page.checksum is None:
                bufs += (build_header(page.key, view), view)
            else:  # a record the caller verified: its checksum, the store's key
                bufs += (header_for(page.key, len(view), page.checksum), view)
            pad = stride - HEADER_BYTES - len(view)
            if pad and n < last:
                bufs.append(gap(pad))
        try:
            self._ctx.segments.write(span.segment, span.offset, bufs)
        except OSError as exc:
            self._ctx.log.failure("disk store write failed; the pages are not stored", exc)
            return False
        return True

    def _index_written(
        self, writer: IndexWriter, placed: list[_Span], written: list[bool], marks: _Marks
    ) -> int:
        """Index the written spans' pages (each marked stored, and fresh when its index
        entry is this batch's); the slots of failed spans go back. Return how many pages
        were indexed."""
        stored = 0
        for span, ok in zip(placed, written, strict=True):
            run, pages = span.slots, span.pages
            unused = [] if ok else run.slots(span.cls.stride)
            if ok:
                keys, lengths = [p.key for p in pages], [len(p.view) for p in pages]
                fresh = writer.insert_run(run, span.cls, keys, lengths)
                for page, new in zip(pages, fresh, strict=True):
                    marks.results[page.pos] = True
                    marks.fresh[page.pos] = new
                stored += sum(fresh)
                if not all(fresh):  # stored meanwhile: not while this transaction holds
                    # the writer lock
                    unused = [
                        slot
                        for slot, new in zip(run.slots(span.cls.stride), fresh, strict=True)
                        if not new
                    ]
            for slot in unused:
                writer.alloc.release(slot, span.cls)
        return stored


# A batch smaller than this per I/O thread is written by fewer threads (a pool hop
# costs tens of microseconds: more than writing a few small pages). As ``reads``.
SPLIT_BYTES = 1 << 20


def _groups(pages: list[_Page], direct_io: bool) -> list[_Group]:
    """``pages`` by slot class (a batch usually holds one page size: one group), largest
    stride first: the smaller slots then fit around the larger ones, not in their way."""
    if len(pages) == 1:
        return [_Group(slot_class(len(pages[0].view), direct_io), pages)]
    lengths = {len(page.view) for page in pages}
    if len(lengths) == 1:
        return [_Group(slot_class(lengths.pop(), direct_io), pages)]
    by_class: dict[SlotClass, list[_Page]] = {}
    for page in pages:
        by_class.setdefault(slot_class(len(page.view), direct_io), []).append(page)
    ordered = sorted(by_class.items(), key=lambda item: -item[0].stride)
    return [_Group(cls, group) for cls, group in ordered]
