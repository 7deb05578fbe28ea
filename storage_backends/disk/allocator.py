"""The slot allocator: free extents and segment tails, kept in the index.

Everything here runs inside one LMDB write transaction, so allocation is atomic
and shared by every process on the store. Free space is a set of extents (segment,
offset, length) of no size class: a freed slot merges with the free extents on
either side, so the space left by pages of one size serves pages of any other
once enough of it lies together. A slot is cut from the smallest extent it fits
(the start aligned to its class), else bumped from a segment's tail; ``allocated``
(the sum of the tails) never exceeds ``max_bytes`` by more than the slot being
taken. An extent that reaches its segment's tail is not kept: the tail comes down.

Invariants: extents never overlap a slot in use or each other, no two touch (they
would have merged) and none ends at its segment's tail.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import NamedTuple

import lmdb

from storage_backends.disk.layout import (
    SLOT_BYTES,
    SLOT_STRUCT,
    Slot,
    SlotClass,
    SlotRun,
    round_up,
)

TAIL_PREFIX = b"tail:"
_ALLOCATED = b"allocated"
FREE_FORMAT = b"free_format"  # meta: 2 once free space is kept as extents
EXTENTS = 2
_LEGACY_FREE_VALUE = 6  # the first format's free value: a slot class (stride, align)


def u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


def from_u64(raw: bytes | memoryview | None) -> int:
    return int.from_bytes(raw, "big") if raw is not None else 0


class Extent(NamedTuple):
    """Free bytes ``[offset, offset + length)`` of one segment."""

    segment: int
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length

    def key(self) -> bytes:
        """Its key in the ``free`` table: where it starts."""
        return SLOT_STRUCT.pack(self.segment, self.offset)

    def size_key(self) -> bytes:
        """Its key in the by-size table: length, then where it starts."""
        return u64(self.length) + SLOT_STRUCT.pack(self.segment, self.offset)


def _sized(raw: bytes | memoryview) -> Extent:
    """The extent of a by-size table key (``Extent.size_key``)."""
    start = Slot.unpack(bytes(raw[8:]))
    return Extent(start.segment, start.offset, from_u64(raw[:8]))


def _candidates(tails: dict[int, int]) -> Iterator[int]:
    """Segments a bump may extend, in order: those in use and the first unused one, then
    the further unused ones (a batch may fill more than one new segment; the caller
    stops at ``max_bytes``)."""
    used = {n for n, tail in tails.items() if tail}
    unused = (n for n in itertools.count() if n not in used)
    yield from sorted(used | {next(unused)})
    yield from unused


def _tail_key(segment: int) -> bytes:
    return TAIL_PREFIX + segment.to_bytes(4, "big")


class FreeDbs(NamedTuple):
    free: lmdb._Database  # extent start (Slot) -> u64 length
    by_size: lmdb._Database  # u64 length + extent start -> b"" (smallest first)
    meta: lmdb._Database  # tails, the allocated total, the free format


class _Fit(NamedTuple):
    extent: Extent
    gap: int  # bytes before the first aligned slot
    slots: int


class Allocator:
    """Slots of one write transaction (``segment_bytes`` per segment, ``max_bytes`` in all).

    Segment tails are read once per transaction and written back by ``finish``.
    """

    def __init__(
        self, txn: lmdb.Transaction, dbs: FreeDbs, segment_bytes: int, max_bytes: int
    ) -> None:
        self._txn = txn
        self._dbs = dbs
        self._segment_bytes = segment_bytes
        self._max_bytes = max_bytes
        self.allocated = from_u64(txn.get(_ALLOCATED, db=dbs.meta))
        self._allocated_read = self.allocated  # written back by ``finish`` only if changed
        self._tails: dict[int, int] | None = None  # every tail, read on first need
        self._read_tails: dict[int, int] = {}  # single tails read before that
        self._changed: set[int] = set()

    def take(self, cls: SlotClass, count: int) -> list[SlotRun]:
        """Up to ``count`` slots of ``cls`` as runs of adjacent slots: cut from free extents
        first (smallest fitting first), then bumped from segment tails, stopping where
        more would allocate beyond ``max_bytes`` plus one slot."""
        runs = self._cut(cls, count)
        taken = sum(run.n_slots for run in runs)
        if taken < count and cls.stride <= self._segment_bytes:
            runs += self._bump(cls, count - taken)
        return runs

    def _fits(self, cls: SlotClass, count: int) -> list[_Fit]:
        """Extents that hold slots of ``cls``, smallest first, until ``count`` slots."""
        fits: list[_Fit] = []
        cursor = self._txn.cursor(db=self._dbs.by_size)
        if not cursor.set_range(u64(cls.stride)):
            return fits
        found = 0
        for raw in cursor.iternext(values=False):
            extent = _sized(raw)
            gap = round_up(extent.offset, cls.align) - extent.offset
            slots = max(0, extent.length - gap) // cls.stride
            if slots:
                fits.append(_Fit(extent, gap, slots))
                found += slots
                if found >= count:
                    break
        return fits

    def _cut(self, cls: SlotClass, count: int) -> list[SlotRun]:
        runs: list[SlotRun] = []
        for fit in self._fits(cls, count):
            extent, n = fit.extent, min(fit.slots, count)
            start = extent.offset + fit.gap
            end = start + n * cls.stride
            left = [Extent(extent.segment, extent.offset, fit.gap)] if fit.gap else []
            if end < extent.end:
                left.append(Extent(extent.segment, end, extent.end - end))
            self._replace([extent], left)
            runs.append(SlotRun(extent.segment, start, n))
            count -= n
        return runs

    def _tail_map(self) -> dict[int, int]:
        if self._tails is None:
            self._tails = {}
            cursor = self._txn.cursor(db=self._dbs.meta)
            if cursor.set_range(TAIL_PREFIX):
                for key, value in cursor:
                    if not bytes(key).startswith(TAIL_PREFIX):
                        break
                    self._tails[int.from_bytes(bytes(key)[len(TAIL_PREFIX) :], "big")] = from_u64(
                        value
                    )
        return self._tails

    def _tail(self, segment: int) -> int:
        """``segment``'s tail; one key read unless every tail is read already."""
        if self._tails is not None:
            return self._tails.get(segment, 0)
        tail = self._read_tails.get(segment)
        if tail is None:
            raw = self._txn.get(_tail_key(segment), db=self._dbs.meta)
            tail = self._read_tails[segment] = from_u64(raw)
        return tail

    def _set_tail(self, segment: int, tail: int) -> None:
        self._tail_map()[segment] = tail
        self._changed.add(segment)

    def _bump(self, cls: SlotClass, count: int) -> list[SlotRun]:
        """Runs of new slots at segment tails with room, in segment order."""
        runs: list[SlotRun] = []
        tails = self._tail_map()
        for segment in _candidates(tails):
            tail = tails.get(segment, 0)
            start = round_up(tail, cls.align)
            room = self._max_bytes + cls.stride - self.allocated - (start - tail)
            fit = min(count, (self._segment_bytes - start) // cls.stride, room // cls.stride)
            if fit <= 0:
                if room < cls.stride:
                    break  # the store is allocated up to max_bytes
                continue
            if start > tail:  # the alignment gap is free space (nothing free ends at a tail)
                self._add_extent(Extent(segment, tail, start - tail))
            runs.append(SlotRun(segment, start, fit))
            self._set_tail(segment, start + fit * cls.stride)
            self.allocated += start + fit * cls.stride - tail
            count -= fit
            if count == 0:
                break
        return runs

    def _add_extent(self, extent: Extent) -> None:
        self._replace([], [extent])

    def _replace(self, old: list[Extent], new: list[Extent]) -> None:
        """Free extents ``old`` become ``new``: the new entries go in first and an old
        entry is deleted only if no new one has its key, so that a table is never
        emptied on the way (LMDB would free its root page and take another, a page a
        release, which the index file keeps)."""
        put, delete, dbs = self._txn.put, self._txn.delete, self._dbs
        for extent in new:
            put(extent.key(), u64(extent.length), db=dbs.free)
            put(extent.size_key(), b"", db=dbs.by_size)
        for extent in old:
            if not any(e.offset == extent.offset and e.segment == extent.segment for e in new):
                delete(extent.key(), db=dbs.free)
            if extent not in new:
                delete(extent.size_key(), db=dbs.by_size)

    def _at(self, cursor: lmdb.Cursor, segment: int) -> Extent | None:
        """The extent under ``cursor`` if it lies in ``segment``."""
        at, offset = SLOT_STRUCT.unpack(cursor.key())
        return Extent(at, offset, from_u64(cursor.value())) if at == segment else None

    def _extent_before(self, slot: Slot) -> Extent | None:
        """The free extent that starts last before ``slot`` in its segment."""
        return self._neighbours(slot)[0]

    def _neighbours(self, slot: Slot) -> tuple[Extent | None, Extent | None]:
        """(the free extent that starts last before ``slot``, the first one at or after
        it), in its segment: one cursor, one seek."""
        cursor = self._txn.cursor(db=self._dbs.free)
        found = cursor.set_range(SLOT_STRUCT.pack(*slot))
        after = self._at(cursor, slot.segment) if found else None
        moved = cursor.prev() if found else cursor.last()
        before = self._at(cursor, slot.segment) if moved else None
        return before, after

    def release(self, slot: Slot, cls: SlotClass) -> bool:
        """Give a slot back, merged with the free extents that touch it; lower the tail if
        the merged extent reaches it. False (nothing changed) for a slot that is not in
        use by the allocator's account: past its segment's tail, or overlapping free
        space (a double release)."""
        start, end, tail = slot.offset, slot.offset + cls.stride, self._tail(slot.segment)
        if end > tail:
            return False
        before, after = self._neighbours(slot)
        if (after and after.offset < end) or (before and before.end > start):
            return False
        merged = [e for e in (before, after) if e and (e.end == start or e.offset == end)]
        start = min([start] + [e.offset for e in merged])
        end = max([end] + [e.end for e in merged])
        if end != tail:
            self._replace(merged, [Extent(slot.segment, start, end - start)])
            return True
        self._replace(merged, [])
        while (below := self._extent_before(Slot(slot.segment, start))) and below.end == start:
            self._replace([below], [])  # a store of the first format: free slots not merged
            start = below.offset
        self.allocated -= tail - start
        self._set_tail(slot.segment, start)
        return True

    def largest(self, limit: int) -> list[Extent]:
        """Up to ``limit`` free extents, largest first."""
        cursor = self._txn.cursor(db=self._dbs.by_size)
        extents: list[Extent] = []
        if limit < 1 or not cursor.last():
            return extents
        for raw in cursor.iterprev(values=False):
            extents.append(_sized(raw))
            if len(extents) == limit:
                break
        return extents

    def upgrade(self) -> int:
        """Turn the first format's free slots (slot -> class, listed per class) into
        extents, once; return how many slots were converted."""
        if from_u64(self._txn.get(FREE_FORMAT, db=self._dbs.meta)) == EXTENTS:
            return 0
        legacy: list[tuple[Slot, SlotClass]] = []
        for key, value in self._txn.cursor(db=self._dbs.free):
            if len(value) == _LEGACY_FREE_VALUE and len(key) == SLOT_BYTES:
                legacy.append((Slot.unpack(bytes(key)), SlotClass.unpack(bytes(value))))
        self._txn.drop(self._dbs.free, delete=False)
        self._txn.drop(self._dbs.by_size, delete=False)
        for slot, cls in legacy:
            self.release(slot, cls)
        self._txn.put(FREE_FORMAT, u64(EXTENTS), db=self._dbs.meta)
        return len(legacy)

    def finish(self) -> None:
        if self.allocated != self._allocated_read:
            self._txn.put(_ALLOCATED, u64(self.allocated), db=self._dbs.meta)
        for segment in self._changed:
            key = _tail_key(segment)
            tail = self._tail(segment)
            if tail:
                self._txn.put(key, u64(tail), db=self._dbs.meta)
            else:
                self._txn.delete(key, db=self._dbs.meta)
