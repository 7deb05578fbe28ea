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
from typing import NamedTuple

import lmdb

from storage_backends.disk.layout import CLASS_BYTES, Slot, SlotClass, round_up

TAIL_PREFIX = b"tail:"
_ALLOCATED = b"allocated"
_FILLER_ALIGN = 1  # class of an alignment gap: never handed out, only trimmed


def u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


def from_u64(raw: bytes | memoryview | None) -> int:
    return int.from_bytes(raw, "big") if raw is not None else 0


class FreeDbs(NamedTuple):
    free: lmdb._Database  # Slot -> SlotClass
    by_class: lmdb._Database  # SlotClass + Slot -> b""
    meta: lmdb._Database  # tails and the allocated total


class Allocator:
    """Slots of one write transaction (``segment_bytes`` per segment, ``max_bytes`` in all)."""

    def __init__(
        self, txn: lmdb.Transaction, dbs: FreeDbs, segment_bytes: int, max_bytes: int
    ) -> None:
        self._txn = txn
        self._dbs = dbs
        self._segment_bytes = segment_bytes
        self._max_bytes = max_bytes
        self.allocated = from_u64(txn.get(_ALLOCATED, db=dbs.meta))

    def take(self, cls: SlotClass) -> Slot | None:
        """A slot of ``cls``, or None when taking one would allocate more than ``max_bytes``
        plus that slot."""
        return self._pop_free(cls) or self._bump(cls)

    def _pop_free(self, cls: SlotClass) -> Slot | None:
        prefix = cls.pack()
        cursor = self._txn.cursor(db=self._dbs.by_class)
        if not cursor.set_range(prefix) or not bytes(cursor.key()).startswith(prefix):
            return None
        slot = Slot.unpack(bytes(cursor.key())[CLASS_BYTES:])
        cursor.delete()
        self._txn.delete(slot.pack(), db=self._dbs.free)
        return slot

    def _tail(self, segment: int) -> int:
        return from_u64(self._txn.get(TAIL_PREFIX + segment.to_bytes(4, "big"), db=self._dbs.meta))

    def _set_tail(self, segment: int, tail: int) -> None:
        key = TAIL_PREFIX + segment.to_bytes(4, "big")
        if tail:
            self._txn.put(key, u64(tail), db=self._dbs.meta)
        else:
            self._txn.delete(key, db=self._dbs.meta)

    def _segments(self) -> list[int]:
        cursor = self._txn.cursor(db=self._dbs.meta)
        found: list[int] = []
        if cursor.set_range(TAIL_PREFIX):
            for key in cursor.iternext(values=False):
                if not bytes(key).startswith(TAIL_PREFIX):
                    break
                found.append(int.from_bytes(bytes(key)[len(TAIL_PREFIX) :], "big"))
        return found

    def _bump(self, cls: SlotClass) -> Slot | None:
        """A new slot at the first segment tail with room for it."""
        if cls.stride > self._segment_bytes:
            return None
        segments = self._segments()
        taken = set(segments)
        unused = next(n for n in itertools.count() if n not in taken)
        for segment in [*segments, unused]:
            tail = self._tail(segment)
            start = round_up(tail, cls.align)
            if start + cls.stride > self._segment_bytes:
                continue
            grown = start + cls.stride - tail
            if self.allocated + grown > self._max_bytes + cls.stride:
                return None
            if start > tail:  # the alignment gap is free space of its own (trimmed later)
                self._add_free(Slot(segment, tail), SlotClass(start - tail, _FILLER_ALIGN))
            self._set_tail(segment, start + cls.stride)
            self.allocated += grown
            return Slot(segment, start)
        return None

    def _add_free(self, slot: Slot, cls: SlotClass) -> None:
        self._txn.put(slot.pack(), cls.pack(), db=self._dbs.free)
        self._txn.put(cls.pack() + slot.pack(), b"", db=self._dbs.by_class)

    def release(self, slot: Slot, cls: SlotClass) -> None:
        """Give a slot back; if it ends at its segment's tail, lower the tail."""
        tail = self._tail(slot.segment)
        if slot.offset + cls.stride != tail:
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
        self.allocated -= self._tail(slot.segment) - tail
        self._set_tail(slot.segment, tail)

    def finish(self) -> None:
        self._txn.put(_ALLOCATED, u64(self.allocated), db=self._dbs.meta)
