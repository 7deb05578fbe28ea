"""The slot allocator: free slots per class and segment tails, kept in the index.

Everything here runs inside one LMDB write transaction, so allocation is atomic
and shared by every process on the store. A slot is taken from its class's free
list, else bumped from a segment's tail; ``allocated`` (the sum of the tails)
never exceeds ``max_bytes`` by more than the slot being taken. A freed slot goes
back to its class; a free run that
reaches a segment's tail lowers the tail, so that space left by one page size
can serve another once the pages in front of it are gone too.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import NamedTuple

import lmdb

from storage_backends.disk.layout import CLASS_BYTES, Slot, SlotClass, SlotRun, round_up

TAIL_PREFIX = b"tail:"
_ALLOCATED = b"allocated"
_FILLER_ALIGN = 1  # class of an alignment gap: never handed out, only trimmed


def u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


def from_u64(raw: bytes | memoryview | None) -> int:
    return int.from_bytes(raw, "big") if raw is not None else 0


def _end(run: SlotRun, cls: SlotClass) -> int:
    return run.offset + run.n_slots * cls.stride


def _candidates(tails: dict[int, int]) -> Iterator[int]:
    """Segments a bump may extend, in order: those in use and the first unused one, then
    the further unused ones (a batch may fill more than one new segment; the caller
    stops at ``max_bytes``)."""
    used = {n for n, tail in tails.items() if tail}
    unused = (n for n in itertools.count() if n not in used)
    yield from sorted(used | {next(unused)})
    yield from unused


class FreeDbs(NamedTuple):
    free: lmdb._Database  # Slot -> SlotClass
    by_class: lmdb._Database  # SlotClass + Slot -> b""
    meta: lmdb._Database  # tails and the allocated total


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
        self._tails: dict[int, int] | None = None
        self._changed: set[int] = set()

    def take(self, cls: SlotClass, count: int) -> list[SlotRun]:
        """Up to ``count`` slots of ``cls`` as runs of adjacent slots: free ones first (in
        slot order), then runs bumped from segment tails, stopping where more would
        allocate beyond ``max_bytes`` plus one slot."""
        runs = self._pop_free(cls, count)
        taken = sum(run.n_slots for run in runs)
        if taken < count and cls.stride <= self._segment_bytes:
            runs += self._bump(cls, count - taken)
        return runs

    def _pop_free(self, cls: SlotClass, count: int) -> list[SlotRun]:
        prefix = cls.pack()
        cursor = self._txn.cursor(db=self._dbs.by_class)
        runs: list[SlotRun] = []
        if not cursor.set_range(prefix):
            return runs
        taken = 0
        while taken < count and bytes(cursor.key()).startswith(prefix):
            slot = Slot.unpack(bytes(cursor.key())[CLASS_BYTES:])
            self._txn.delete(slot.pack(), db=self._dbs.free)
            taken += 1
            last = runs[-1] if runs else None
            if last and last.segment == slot.segment and _end(last, cls) == slot.offset:
                runs[-1] = last._replace(n_slots=last.n_slots + 1)
            else:
                runs.append(SlotRun(slot.segment, slot.offset, 1))
            if not cursor.delete():  # moves to the next entry; False at the end
                break
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
        return self._tail_map().get(segment, 0)

    def _set_tail(self, segment: int, tail: int) -> None:
        self._tail_map()[segment] = tail
        self._changed.add(segment)

    def _bump(self, cls: SlotClass, count: int) -> list[SlotRun]:
        """Runs of new slots at segment tails with room, in segment order."""
        runs: list[SlotRun] = []
        for segment in _candidates(self._tail_map()):
            tail = self._tail(segment)
            start = round_up(tail, cls.align)
            room = self._max_bytes + cls.stride - self.allocated - (start - tail)
            fit = min(count, (self._segment_bytes - start) // cls.stride, room // cls.stride)
            if fit <= 0:
                if room < cls.stride:
                    break  # the store is allocated up to max_bytes
                continue
            if start > tail:  # the alignment gap is free space of its own (trimmed later)
                self._add_free(Slot(segment, tail), SlotClass(start - tail, _FILLER_ALIGN))
            runs.append(SlotRun(segment, start, fit))
            self._set_tail(segment, start + fit * cls.stride)
            self.allocated += start + fit * cls.stride - tail
            count -= fit
            if count == 0:
                break
        return runs

    def _add_free(self, slot: Slot, cls: SlotClass) -> None:
        self._txn.put(slot.pack(), cls.pack(), db=self._dbs.free)
        self._txn.put(cls.pack() + slot.pack(), b"", db=self._dbs.by_class)

    def release(self, slot: Slot, cls: SlotClass) -> None:
        """Give a slot back; if it ends at its segment's tail, lower the tail."""
        old_tail = self._tail(slot.segment)
        if slot.offset + cls.stride != old_tail:
            self._add_free(slot, cls)
            return
        tail = slot.offset
        cursor = self._txn.cursor(db=self._dbs.free)
        while tail > 0:
            # The free slot just before the tail, if it ends there, goes too.
            found = cursor.set_range(Slot(slot.segment, tail).pack())
            if not (cursor.prev() if found else cursor.last()):
                break
            before = Slot.unpack(bytes(cursor.key()))
            before_cls = SlotClass.unpack(bytes(cursor.value()))
            if before.segment != slot.segment or before.offset + before_cls.stride != tail:
                break
            cursor.delete()
            self._txn.delete(before_cls.pack() + before.pack(), db=self._dbs.by_class)
            tail = before.offset
        self.allocated -= old_tail - tail
        self._set_tail(slot.segment, tail)

    def finish(self) -> None:
        self._txn.put(_ALLOCATED, u64(self.allocated), db=self._dbs.meta)
        for segment in self._changed:
            key = TAIL_PREFIX + segment.to_bytes(4, "big")
            tail = self._tail(segment)
            if tail:
                self._txn.put(key, u64(tail), db=self._dbs.meta)
            else:
                self._txn.delete(key, db=self._dbs.meta)
