"""The allocator's page table: each page's ownership state and the free stack.

Two implementations share this module name and behaviour (same results, same
``SlotError`` messages, tested against each other): this file, vectorised
with numpy, and ``page_table.pyx``, the same steps as typed C loops. The
compiled one runs when it is built and current (``device_pool.native``); a
request's transitions are then one C call each instead of a dozen numpy
calls, which is where a page-1 request spent a quarter of its time.

States: ``FREE`` (on the free stack), ``REQUEST`` (handed out by ``alloc``),
``TREE`` (owned by the radix tree); ``ALLOCATED`` names either of the last
two as an expected state. Slots arrive as 1-D int64 numpy arrays (the
allocator converts tensors); slot ``s`` is on page ``s // page_size``.
"""

from __future__ import annotations

from typing import NoReturn

import numpy as np

from device_pool.slot_error import SlotError

FREE, REQUEST, TREE, ALLOCATED = 0, 1, 2, 3
STATE_NAMES = ("free", "request-held", "tree-owned", "allocated")
_STATE_BYTES = (b"\x00", b"\x01", b"\x02")  # one state-table entry (int8) as bytes


class PageTable:
    """Page states and the free stack of one pool.

    Mutates only itself; not thread-safe. ``move`` and ``commit`` check every
    page before changing any (``SlotError``, nothing changed)."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.page_size = page_size
        self.num_pages = num_pages
        self.num_free = num_pages
        self.request_pages = 0
        # slot_grid[p] = the slots of page p: one gather builds or checks pages.
        self._slot_grid = np.arange(num_pages * page_size, dtype=np.int64).reshape(-1, page_size)
        self._state = np.zeros(num_pages, dtype=np.int8)
        self._seen = np.zeros(num_pages, dtype=np.int64)  # duplicate detection scratch
        self._positions = np.arange(num_pages, dtype=np.int64)
        # Low pages go out first (a stack whose top is at ``num_free``).
        self._free_pages = np.arange(num_pages - 1, -1, -1, dtype=np.int64)

    def counts(self) -> tuple[int, int, int]:
        """Pages per state (free, request, tree), counted from the table."""
        per = np.bincount(self._state, minlength=3)
        return int(per[FREE]), int(per[REQUEST]), int(per[TREE])

    def alloc(self, n: int) -> np.ndarray:
        """Pop ``n`` (1 <= n <= num_free) pages, now request-held; their slots."""
        if not 1 <= n <= self.num_free:
            raise ValueError(f"cannot pop {n} pages: {self.num_free} are free")
        top = self.num_free
        pages = self._free_pages[top - n : top][::-1]  # a view: copied below
        self.num_free = top - n
        self._state[pages] = REQUEST
        self.request_pages += n
        if self.page_size == 1:
            return pages.copy()
        # take(axis=0) gathers whole rows at about half the cost of fancy indexing
        return self._slot_grid.take(pages, axis=0).reshape(-1)

    def move(self, slots: np.ndarray, expect: int, to: int, whole: bool) -> None:
        """Pages of ``slots`` in state ``expect`` pass to state ``to`` (``FREE``
        pushes them on the free stack). Without ``whole``, only each page's
        first slot is range-checked (slots the tree took whole); a page listed
        twice is refused either way when the state changes."""
        pages = self._checked(slots, expect, whole, distinct=expect != to)
        if pages.size and expect != to:
            self._account(pages, expect, to)
            self._set(pages, to)

    def commit(self, to_tree: np.ndarray, to_free: np.ndarray) -> None:
        """Request-held pages of ``to_tree`` pass to the tree, those of ``to_free``
        are freed: one check over both (whole, distinct across both)."""
        for part in (to_tree, to_free):  # each whole: the split between them is by pages
            if part.size % self.page_size:
                raise SlotError(f"{part.size} slots do not form whole pages of {self.page_size}")
        both = np.concatenate((to_tree, to_free)) if to_free.size else to_tree
        pages = self._checked(both, REQUEST, True, True)
        keep = to_tree.size // self.page_size
        self._state[pages[:keep]] = TREE
        self._set(pages[keep:], FREE)
        self.request_pages -= pages.size

    def whole_pages(self, slots: np.ndarray, every_slot: bool) -> np.ndarray:
        """Page numbers of ``slots``: whole pages (slots of a page in order), in
        range, each listed once; ``every_slot=False`` range-checks only each
        page's first slot and skips the duplicate check."""
        ps = self.page_size
        if slots.size % ps:
            raise SlotError(f"{slots.size} slots do not form whole pages of {ps}")
        if not slots.size:
            return slots.astype(np.int64)
        if ps == 1:
            pages = slots
        else:
            pages = slots[::ps] // ps
            if every_slot:  # one gather checks range and layout; diagnosed on failure
                try:
                    rows = self._slot_grid.take(pages, axis=0)
                except IndexError:
                    rows = None
                if rows is None or slots.tobytes() != rows.tobytes():
                    self._diagnose(pages)
                self._check_distinct(pages)
                return pages
        # One reduction for both ends: a negative page is huge as unsigned.
        if int(pages.view(np.uint64).max()) >= self.num_pages:
            self._out_of_range()
        if every_slot:
            self._check_distinct(pages)
        return pages

    def _account(self, pages: np.ndarray, expect: int, to: int) -> None:
        held = pages.size if expect == REQUEST else 0
        if expect == ALLOCATED:
            held = int(np.count_nonzero(self._state[pages] == REQUEST))
        self.request_pages += (pages.size if to == REQUEST else 0) - held

    def _set(self, pages: np.ndarray, to: int) -> None:
        if not pages.size:
            return
        self._state[pages] = to
        if to == FREE:
            top = self.num_free
            self._free_pages[top : top + pages.size] = pages
            self.num_free = top + pages.size

    def _checked(self, slots: np.ndarray, expect: int, whole: bool, distinct: bool) -> np.ndarray:
        pages = self.whole_pages(slots, every_slot=whole)  # distinct too when whole
        if distinct and not whole:
            self._check_distinct(pages)
        if not pages.size:
            return pages
        # Small arrays: a bytes comparison costs a fraction of a ufunc plus any().
        have = self._state[pages]
        raw = have.tobytes()
        if expect == ALLOCATED:
            if _STATE_BYTES[FREE] not in raw:
                return pages
            bad = have == FREE
        elif raw == _STATE_BYTES[expect] * pages.size:
            return pages
        else:
            bad = have != expect
        first = int(np.argmax(bad))
        raise SlotError(
            f"page {int(pages[first])} is {STATE_NAMES[int(have[first])]}, "
            f"expected {STATE_NAMES[expect]}"
        )

    def _diagnose(self, pages: np.ndarray) -> NoReturn:
        """Raise the SlotError that names why slots failed the fast check."""
        if int(pages.view(np.uint64).max()) >= self.num_pages:
            self._out_of_range()
        raise SlotError("slots are not whole pages in order")

    def _out_of_range(self) -> NoReturn:
        raise SlotError(f"slot index out of range [0, {self.num_pages * self.page_size})")

    def _check_distinct(self, pages: np.ndarray) -> None:
        # Scatter each position into its page; a page listed twice keeps only
        # the last position, so an earlier one reads back different.
        if pages.size < 2:
            return
        if pages.size > self.num_pages:
            raise SlotError("a page is listed twice")
        pos = self._positions[: pages.size]
        self._seen[pages] = pos
        if self._seen[pages].tobytes() != pos.tobytes():
            raise SlotError("a page is listed twice")
