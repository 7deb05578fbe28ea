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

from typing import NamedTuple

import numpy as np
import torch

FREE, REQUEST, TREE = 0, 1, 2
_STATE_NAMES = ("free", "request-held", "tree-owned")


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
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int | np.integer):
            raise TypeError(f"alloc size must be an int, got {type(num_tokens).__name__}")
        if num_tokens < 0 or num_tokens % self.page_size:
            raise ValueError(f"alloc size {num_tokens} is not a multiple of {self.page_size}")
        n = int(num_tokens) // self.page_size
        if n > self._num_free:
            return None
        if n == 0:
            return torch.empty(0, dtype=torch.int64)
        top = self._num_free
        pages = self._free_pages[top - n : top][::-1].copy()
        self._num_free = top - n
        self._state[pages] = REQUEST
        self._request_pages += n
        if self.page_size == 1:
            return torch.from_numpy(pages)
        return torch.from_numpy(self._slot_grid[pages].reshape(-1))

    def check_request_held(self, slots: torch.Tensor) -> None:
        """SlotError unless ``slots`` are whole request-held pages, each listed once."""
        self._pages_in(slots, REQUEST)

    def to_tree(self, slots: torch.Tensor) -> None:
        """Request-held pages pass to the tree (an insert, a load-back, a backup)."""
        pages = self._pages_in(slots, REQUEST)
        self._state[pages] = TREE
        self._request_pages -= pages.size

    def commit_request(self, to_tree: torch.Tensor, to_free: torch.Tensor) -> None:
        """One checked step for a request's slots at insert: ``to_tree`` pass to
        the tree, ``to_free`` (duplicates of the tree's pages) are freed. Both
        must be request-held whole pages, no page listed twice across both;
        otherwise SlotError and nothing changes."""
        both = to_tree if not to_free.numel() else torch.cat([to_tree, to_free])
        pages = self._pages_in(both, REQUEST)
        keep = to_tree.numel() // self.page_size
        self._state[pages[:keep]] = TREE
        self._release(pages[keep:])
        self._request_pages -= pages.size

    def free_request(self, slots: torch.Tensor) -> None:
        """Return request-held pages that never reached the tree."""
        pages = self._pages_in(slots, REQUEST)
        self._release(pages)
        self._request_pages -= pages.size

    def free_tree(self, slots: torch.Tensor) -> None:
        """Return pages the tree owned (eviction, a failed copy, reset).

        The tree's slots were checked whole and distinct when they entered it
        (``to_tree``, ``commit_request``), so this checks per page only, in
        O(pages): in range and tree-owned (a double free fails here)."""
        self._release(self._pages_in(slots, TREE, whole=False))

    def free(self, slots: torch.Tensor) -> None:
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

    def _pages_in(self, slots: torch.Tensor, state: int | None, whole: bool = True) -> np.ndarray:
        """The pages of ``slots``, checked: whole (or, without ``whole``, only
        their first slots), in range, distinct, and in ``state`` (None: any
        allocated state)."""
        pages = self.whole_pages(slots, every_slot=whole)
        if not pages.size:
            return pages
        have = self._state[pages]
        bad = have == FREE if state is None else have != state
        if bad.any():
            got = _STATE_NAMES[int(have[np.argmax(bad)])]
            want = "allocated" if state is None else _STATE_NAMES[state]
            raise SlotError(f"page {int(pages[np.argmax(bad)])} is {got}, expected {want}")
        return pages

    def whole_pages(self, slots: torch.Tensor, every_slot: bool = True) -> np.ndarray:
        """Page numbers of ``slots``; SlotError unless they form whole pages (slots
        of a page in order), in range, each page listed once. Vectorised; with
        ``every_slot=False`` only each page's first slot is range-checked
        (O(pages); for slots that were checked whole when handed in)."""
        if not isinstance(slots, torch.Tensor) or slots.dtype != torch.int64 or slots.dim() != 1:
            got = f"{slots.dtype} {tuple(slots.shape)}" if isinstance(slots, torch.Tensor) else ""
            raise SlotError(f"slots must be a 1-D int64 tensor, got {got or type(slots)}")
        flat = slots.numpy() if slots.device.type == "cpu" else slots.cpu().numpy()
        ps = self.page_size
        if flat.size % ps:
            raise SlotError(f"{flat.size} slots do not form whole pages of {ps}")
        if not flat.size:
            return flat.astype(np.int64)
        first = flat[::ps]
        pages = first // ps if ps > 1 else first
        # One reduction for both ends: a negative page is huge as unsigned.
        if int(pages.view(np.uint64).max()) >= self.num_pages:
            raise SlotError(f"slot index out of range [0, {self.capacity})")
        if not every_slot:
            return pages
        if ps > 1 and (flat.reshape(-1, ps) != self._slot_grid[pages]).any():
            raise SlotError("slots are not whole pages in order")
        self._check_distinct(pages)
        return pages

    def _check_distinct(self, pages: np.ndarray) -> None:
        # Scatter each position into its page; a page listed twice keeps only
        # the last position, so an earlier one reads back different.
        if pages.size < 2:
            return
        if pages.size > self.num_pages:
            raise SlotError("a page is listed twice")
        pos = self._positions[: pages.size]
        self._seen[pages] = pos
        if (self._seen[pages] != pos).any():
            raise SlotError("a page is listed twice")
