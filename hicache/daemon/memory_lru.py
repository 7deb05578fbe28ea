"""ByteLRU: the daemon's in-memory page cache, bounded in bytes, in two segments (new and
reused pages), with two-read admission for pages read from the store."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

from storage_backends.remote.protocol import Frame

# Charged per entry on top of the record, so that many tiny pages also respect the bound:
# the key and record objects, the OrderedDict slot and node, allocator rounding (measured).
ENTRY_OVERHEAD = 256
# Keys read once and not cached that the tier remembers (``admit``): one per this much
# capacity (at least MIN_GHOSTS), each ~150 bytes (0.2 % of the capacity they stand for).
GHOST_SPAN = 64 << 10
MIN_GHOSTS = 64
# The share of the capacity that pages read again (the protected segment) may fill; the
# rest is always left to new pages, so a stream of new pages never evicts them all, and
# pages read again never leave new ones no room.
PROTECTED_SHARE = 0.75


class LruSize(NamedTuple):
    entries: int
    bytes_used: int
    evictions: int


class _Segment:
    """Key -> record in LRU order, with its bytes (record + ``ENTRY_OVERHEAD`` each).
    Not thread-safe: ``ByteLRU``'s lock guards it."""

    def __init__(self) -> None:
        self.pages: OrderedDict[bytes, Frame] = OrderedDict()
        self.nbytes = 0

    def add(self, key: bytes, record: Frame) -> None:
        self.pages[key] = record
        self.nbytes += len(record) + ENTRY_OVERHEAD

    def remove(self, key: bytes) -> Frame | None:
        record = self.pages.pop(key, None)
        if record is not None:
            self.nbytes -= len(record) + ENTRY_OVERHEAD
        return record

    def oldest(self) -> tuple[bytes, Frame]:
        key, record = self.pages.popitem(last=False)
        self.nbytes -= len(record) + ENTRY_OVERHEAD
        return key, record


class ByteLRU:
    """Key → page record, least recently used first out once ``capacity`` bytes are exceeded.

    Two segments (a segmented LRU): pages stored by a PUT enter the *new* one
    (``put(..., new=True)``); a page read from it moves to the *reused* one, which
    also takes pages read from the store a second time. Room is made from the new
    segment first, then from the reused one; the reused segment holds at most
    ``PROTECTED_SHARE`` of the capacity (its least recent pages move back to the new
    one). So a stream of PUTs cycles through the new segment without evicting the
    pages clients read again, and a PUT followed by a GET is served from memory.

    Thread-safe (one lock). Records are kept as given, never copied here.
    ``generation`` changes on every removal so that a reader can tell that a delete
    raced its read-through. ``admit`` decides which records read from the store are
    worth caching: those read a second time (a page read once, as most of a bulk
    transfer is, would only pass through: copying it into fresh memory costs more CPU
    than reading it from the store again).
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._protected_cap = int(capacity * PROTECTED_SHARE)
        self._new = _Segment()
        self._reused = _Segment()
        self._ghosts: OrderedDict[bytes, None] = OrderedDict()  # read once, not cached
        self._max_ghosts = max(MIN_GHOSTS, capacity // GHOST_SPAN)
        self._evictions = 0
        self._generation = 0
        self._lock = threading.Lock()

    @property
    def generation(self) -> int:
        return self._generation

    def get(self, key: bytes) -> Frame | None:
        """The record of ``key`` (made most recently used; a new page becomes a reused
        one), or None."""
        with self._lock:
            record = self._reused.pages.get(key)
            if record is not None:
                self._reused.pages.move_to_end(key)
                return record
            record = self._new.remove(key)
            if record is not None:
                self._reused.add(key, record)
                self._cap_reused()
            return record

    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            return key in self._reused.pages or key in self._new.pages

    def admit(self, key: bytes) -> bool:
        """Whether the record of ``key``, just read from the store, should be cached now:
        True on its second read while it is remembered (it is then forgotten); False on a
        first read, which remembers it (the oldest remembered key is forgotten first).
        Mutates the remembered keys only."""
        with self._lock:
            if key in self._ghosts:
                del self._ghosts[key]
                return True
            self._ghosts[key] = None
            if len(self._ghosts) > self._max_ghosts:
                self._ghosts.popitem(last=False)
            return False

    def admits(self, nbytes: int) -> bool:
        """Whether a record of ``nbytes`` could be cached at all (it fits the capacity)."""
        return nbytes + ENTRY_OVERHEAD <= self._capacity

    def put(
        self, key: bytes, record: Frame, generation: int | None = None, new: bool = False
    ) -> bool:
        """Insert (or replace) ``key``: into the new segment with ``new`` (a page just
        stored), else into the reused one; evicts as needed. With ``generation``, only if
        no removal happened since it was read. Returns whether the record is now cached."""
        size = len(record) + ENTRY_OVERHEAD
        with self._lock:
            if size > self._capacity or (generation not in (None, self._generation)):
                return False
            self._new.remove(key)
            self._reused.remove(key)
            if new:
                self._new.add(key, record)
            else:
                self._reused.add(key, record)
                self._cap_reused()
            self._evict()
            return True

    def _cap_reused(self) -> None:
        """The reused segment's least recent pages back to the new one, down to its share."""
        while self._reused.nbytes > self._protected_cap and len(self._reused.pages) > 1:
            self._new.add(*self._reused.oldest())

    def _evict(self) -> None:
        while self._new.nbytes + self._reused.nbytes > self._capacity:
            self._new.oldest() if self._new.pages else self._reused.oldest()
            self._evictions += 1

    def pop(self, key: bytes) -> bool:
        """Remove ``key``; return whether it was cached."""
        with self._lock:
            self._generation += 1
            if self._new.remove(key) is not None:  # a key is in one segment at most
                return True
            return self._reused.remove(key) is not None

    def size(self) -> LruSize:
        with self._lock:
            entries = len(self._new.pages) + len(self._reused.pages)
            return LruSize(entries, self._new.nbytes + self._reused.nbytes, self._evictions)
