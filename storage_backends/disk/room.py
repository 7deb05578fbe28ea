"""Room for a slot that no free extent holds: eviction aimed at space, not only at age.

When the least recently used page's slot holds a slot of the size wanted, it goes
(a store of one page size evicts by age alone). When it does not and the free
extents are all too small for the size (a store full of smaller pages: a second
model, an upgrade), evicting least recently used pages could go on until the whole
store is free, since pages evicted one by one here and there rarely lie together.
Instead, each step evicts the page that lies right after one of the largest free
extents, so that extent grows by that page's slot; it holds the new slot after
about ``stride / (the old pages' stride)`` steps. The index has
no map from places to pages, so the page after an extent is found by reading the
key in the record header at the extent's end and checking that the index puts that
key there. That holds under the index's write lock (every record is written while
a writer holds it); a header that cannot be read, or whose key the index puts
elsewhere (damage, or the record of a put killed before its commit), is a place
nobody is known to hold: never freed, passed over.

With no free extent at all (every byte below the tails in a slot: a full store whose
records are smaller than their slots, so that their bytes alone never call for an
eviction), the least recently used page goes: its slot is the free space.

Bound: a put of ``n`` slots of ``stride`` evicts, beyond the least recently used
pages that make its bytes fit ``max_bytes``, pages covering at most
``n * stride + n * (align + the largest stride evicted)`` bytes, plus at most
``BLIND_EVICTIONS`` least recently used pages when none of the ``_GROWABLE``
largest extents can grow (damage at their ends, or the batch's own new slots
there); then the put's remaining pages fail.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from storage_backends.disk.allocator import Extent
from storage_backends.disk.layout import Location, Slot, SlotClass, round_up
from storage_backends.disk.segments import SegmentFiles
from storage_backends.page_format import HEADER_BYTES, MAGIC, parse_header

# The key in the record header at a slot, None where there is no readable header.
KeyReader = Callable[[Slot], bytes | None]
BLIND_EVICTIONS = 8
_GROWABLE = 16  # the largest extents tried, in turn, before an eviction by age


def no_reader(slot: Slot) -> bytes | None:
    """A ``KeyReader`` that knows no record (room is then made by age only)."""
    return None


def record_key(segments: SegmentFiles, slot: Slot) -> bytes | None:
    """The key in the header of the record at ``slot`` (None: unreadable, not a record)."""
    header = bytearray(HEADER_BYTES)
    try:
        got = segments.read(slot.segment, slot.offset, [header])
    except OSError:
        return None
    parsed = parse_header(bytes(header)) if got == HEADER_BYTES else None
    return parsed.key if parsed is not None and parsed.magic == MAGIC else None


class Evictor(Protocol):
    """What room-making needs of an index write transaction (``IndexWriter``)."""

    def largest_free(self, limit: int) -> list[Extent]: ...

    def holds(self, key: bytes, slot: Slot) -> bool: ...

    def evict(self, key: bytes) -> bool: ...

    def evict_one(self) -> bool: ...

    def oldest(self) -> Location | None: ...


def _holds_one(loc: Location, cls: SlotClass) -> bool:
    """Whether ``loc``'s slot, once free, holds a slot of ``cls`` by itself."""
    return round_up(loc.offset, cls.align) + cls.stride <= loc.offset + loc.stride


class Room:
    """Room-making for one ``reserve`` call. Not thread-safe (one write transaction)."""

    def __init__(self, writer: Evictor, cls: SlotClass, read_key: KeyReader) -> None:
        self._writer = writer
        self._cls = cls
        self._read_key = read_key
        self._blind = 0

    def make(self) -> bool:
        """Evict one page to grow free space; False once nothing more may be evicted."""
        oldest = self._writer.oldest()
        if oldest is not None and _holds_one(oldest, self._cls):
            return self._writer.evict_one()  # a page of this size or larger: by age
        extents = self._writer.largest_free(_GROWABLE)
        if not extents:  # all free space is used: the oldest page's slot is the next
            return self._writer.evict_one()
        for extent in extents:
            after = Slot(extent.segment, extent.end)
            key = self._read_key(after)
            if key is not None and self._writer.holds(key, after):
                return self._writer.evict(key)
        if self._blind >= BLIND_EVICTIONS:
            return False
        self._blind += 1
        return self._writer.evict_one()
