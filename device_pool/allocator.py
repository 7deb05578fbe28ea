"""Page-granular slot allocator with per-page ownership, shared by both pools.

It owns only indices, no memory, which is why the host pool reuses it rather
than keeping a copy of its own. Every page is in one of three states:

- ``FREE``: on the free list;
- ``REQUEST``: handed out by ``alloc`` and not yet given to the tree (a
  request's slots on device, a prefetch's reserved slots on host);
- ``TREE``: owned by a node of the radix tree.

Every call that takes slots back checks them against these states before
anything changes, vectorised in O(pages): whole pages, in range, listed once,
and in the state the call expects. ``SlotError`` otherwise.
"""

from __future__ import annotations

from typing import NamedTuple, NoReturn

import numpy as np
import torch

FREE, REQUEST, TREE = 0, 1, 2
_STATE_NAMES = ("free", "request-held", "tree-owned")
_STATE_BYTES = (b"\x00", b"\x01", b"\x02")  # one state-table entry (int8) as bytes
_INT_TYPES = (int, np.integer)
Slots = torch.Tensor | np.ndarray  # 1-D int64; numpy from the tree, torch from callers


class SlotError(ValueError):
    """Slots that are not whole pages, out of range, listed twice, or not in
    the state a call expects (a double free, a tree page freed by a request)."""


class OwnershipCounts(NamedTuple):
    """Slots per ownership state (multiples of ``page_size``)."""

    free: int
    request: int
    tree: int


class PagedAllocator:
    """Hands out whole pages of slots; slot ``s`` belongs to page ``s // page_size``.

    Mutates only itself. Not thread-safe: one owner thread calls it.
    ``alloc`` returns a fresh int64 tensor (never a view of internal state) or
    ``None`` when there are not enough free pages; the pages are then
    request-held. Transitions: ``to_tree`` (request → tree), ``free_request``
    (request → free), ``free_tree`` (tree → free), ``free`` (either → free).
    Each raises ``SlotError`` and changes nothing when a page is not in the
    expected state; ``check_request_held`` checks without changing anything.
    """

    def __init__(self, num_tokens: int, page_size: int) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if num_tokens < page_size or num_tokens % page_size:
            raise ValueError(
                f"capacity {num_tokens} must be a positive multiple of page_size {page_size}"
            )
        self.page_size = page_size
        self.num_pages = num_tokens // page_size
        # slot_grid[p] = the slots of page p: one gather builds or checks pages.
        self._slot_grid = np.arange(num_tokens, dtype=np.int64).reshape(-1, page_size)
        self._slot_grid.flags.writeable = False  # ``page_slots`` hands out views of it
        # numpy, not torch, for the bookkeeping: numpy's per-call overhead is
        # a fraction of torch's.
        self._state = np.zeros(self.num_pages, dtype=np.int8)
        self._seen = np.zeros(self.num_pages, dtype=np.int64)  # duplicate detection scratch
        self._positions = np.arange(self.num_pages, dtype=np.int64)
        # A stack of free pages (top at ``_num_free``), reversed so that low
        # pages go out first: easier to read in dumps.
        self._free_pages = np.arange(self.num_pages - 1, -1, -1, dtype=np.int64)
        self._num_free = self.num_pages
        self._request_pages = 0

    @property
    def capacity(self) -> int:
        """Total slots, free or not."""
        return self.num_pages * self.page_size

    def available(self) -> int:
        """Free slots (always a multiple of ``page_size``)."""
        return self._num_free * self.page_size

    def request_held(self) -> int:
        """Slots handed out by ``alloc`` and not yet given to the tree or freed."""
        return self._request_pages * self.page_size

    def counts(self) -> OwnershipCounts:
        """Slots per state, counted from the state table (O(pages); for checks)."""
        ps = self.page_size
        per = np.bincount(self._state, minlength=3)
        return OwnershipCounts(int(per[FREE]) * ps, int(per[REQUEST]) * ps, int(per[TREE]) * ps)

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Allocate ``num_tokens`` slots (a multiple of page_size), request-held."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, _INT_TYPES):
            raise TypeError(f"alloc size must be an int, got {type(num_tokens).__name__}")
        if num_tokens < 0 or num_tokens % self.page_size:
            raise ValueError(f"alloc size {num_tokens} is not a multiple of {self.page_size}")
        n = int(num_tokens) // self.page_size
        if n > self._num_free:
            return None
        if n == 0:
            return torch.empty(0, dtype=torch.int64)
        top = self._num_free
        pages = self._free_pages[top - n : top][::-1]  # a view: copied below
        self._num_free = top - n
        self._state[pages] = REQUEST
        self._request_pages += n
        if self.page_size == 1:
            return torch.from_numpy(pages.copy())
        # take(axis=0) gathers whole rows at about half the cost of fancy indexing
        return torch.from_numpy(self._slot_grid.take(pages, axis=0).reshape(-1))

    def page_slots(self, slot: int) -> np.ndarray:
        """The slots of the page that holds ``slot``: a read-only view (numpy:
        a fraction of a tensor's per-call cost); SlotError outside the pool."""
        page = slot // self.page_size
        if not 0 <= page < self.num_pages:
            raise SlotError(f"slot {slot} is outside the pool [0, {self.capacity})")
        row: np.ndarray = self._slot_grid[page]
        return row

    def check_request_held(self, slots: Slots) -> None:
        """SlotError unless ``slots`` are whole request-held pages, each listed once."""
        self._pages_in(slots, REQUEST)

    def to_tree(self, slots: Slots) -> None:
        """Request-held pages pass to the tree (an insert, a load-back, a backup)."""
        pages = self._pages_in(slots, REQUEST)
        self._state[pages] = TREE
        self._request_pages -= pages.size

    def commit_request(self, to_tree: Slots, to_free: Slots) -> None:
        """One checked step for a request's slots at insert: ``to_tree`` pass to
        the tree, ``to_free`` (duplicates of the tree's pages) are freed. Both
        must be request-held whole pages, no page listed twice across both;
        otherwise SlotError and nothing changes."""
        tree_part, free_part = _flat(to_tree), _flat(to_free)
        both = np.concatenate((tree_part, free_part)) if free_part.size else tree_part
        pages = self._pages_in(both, REQUEST)
        keep = tree_part.size // self.page_size
        self._state[pages[:keep]] = TREE
        self._release(pages[keep:])
        self._request_pages -= pages.size

    def free_request(self, slots: Slots) -> None:
        """Return request-held pages that never reached the tree."""
        pages = self._pages_in(slots, REQUEST)
        self._release(pages)
        self._request_pages -= pages.size

    def free_tree(self, slots: Slots) -> None:
        """Return pages the tree owned (eviction, a failed copy, reset).

        The tree's slots were checked whole and distinct when they entered it
        (``to_tree``, ``commit_request``), so this checks per page only, in
        O(pages): in range and tree-owned (a double free fails here)."""
        self._release(self._pages_in(slots, TREE, whole=False))

    def free(self, slots: Slots) -> None:
        """Return allocated pages, request-held or tree-owned (not free ones)."""
        pages = self._pages_in(slots, None)
        self._request_pages -= int(np.count_nonzero(self._state[pages] == REQUEST))
        self._release(pages)

    def _release(self, pages: np.ndarray) -> None:
        if pages.size:
            self._state[pages] = FREE
            top = self._num_free
            self._free_pages[top : top + pages.size] = pages
            self._num_free = top + pages.size

    def _pages_in(self, slots: Slots, state: int | None, whole: bool = True) -> np.ndarray:
        """The pages of ``slots``, checked: whole (or, without ``whole``, only
        their first slots), in range, distinct, and in ``state`` (None: any
        allocated state)."""
        pages = self.whole_pages(slots, every_slot=whole)
        if not pages.size:
            return pages
        # Small arrays: a bytes comparison costs a fraction of a ufunc plus any().
        have = self._state[pages]
        raw = have.tobytes()
        if state is None:
            if _STATE_BYTES[FREE] not in raw:
                return pages
            bad = have == FREE
        elif raw == _STATE_BYTES[state] * pages.size:
            return pages
        else:
            bad = have != state
        got = _STATE_NAMES[int(have[np.argmax(bad)])]
        want = "allocated" if state is None else _STATE_NAMES[state]
        raise SlotError(f"page {int(pages[np.argmax(bad)])} is {got}, expected {want}")

    def whole_pages(self, slots: Slots, every_slot: bool = True) -> np.ndarray:
        """Page numbers of ``slots``; SlotError unless they form whole pages (slots
        of a page in order), in range, each page listed once. Vectorised; with
        ``every_slot=False`` only each page's first slot is range-checked
        (O(pages); for slots that were checked whole when handed in)."""
        flat = _flat(slots)
        ps = self.page_size
        if flat.size % ps:
            raise SlotError(f"{flat.size} slots do not form whole pages of {ps}")
        if not flat.size:
            return flat.astype(np.int64)
        if ps == 1:
            pages = flat
        else:
            pages = flat[::ps] // ps
            if every_slot:  # one gather checks range and layout; diagnosed on failure
                try:
                    rows = self._slot_grid.take(pages, axis=0)
                except IndexError:
                    rows = None
                if rows is None or flat.tobytes() != rows.tobytes():
                    self._diagnose(flat, pages)
                self._check_distinct(pages)
                return pages
        # One reduction for both ends: a negative page is huge as unsigned.
        if int(pages.view(np.uint64).max()) >= self.num_pages:
            raise SlotError(f"slot index out of range [0, {self.capacity})")
        if every_slot:
            self._check_distinct(pages)
        return pages

    def _diagnose(self, flat: np.ndarray, pages: np.ndarray) -> NoReturn:
        """Raise the SlotError that names why ``flat`` failed the fast check."""
        if int(pages.view(np.uint64).max()) >= self.num_pages:
            raise SlotError(f"slot index out of range [0, {self.capacity})")
        raise SlotError("slots are not whole pages in order")

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


def _flat(slots: Slots) -> np.ndarray:
    """``slots`` as a 1-D int64 numpy array (a view when already on the CPU);
    SlotError for anything else."""
    if isinstance(slots, np.ndarray):
        if slots.dtype != np.int64 or slots.ndim != 1:
            raise SlotError(f"slots must be 1-D int64, got {slots.dtype} {slots.shape}")
        return slots
    if not isinstance(slots, torch.Tensor) or slots.dtype != torch.int64 or slots.dim() != 1:
        got = f"{slots.dtype} {tuple(slots.shape)}" if isinstance(slots, torch.Tensor) else ""
        raise SlotError(f"slots must be a 1-D int64 tensor, got {got or type(slots)}")
    return slots.numpy() if slots.is_cpu else slots.cpu().numpy()
