"""Page-granular slot allocator with per-page ownership, shared by both pools.

It owns only indices, no memory, which is why the host pool reuses it rather
than keeping a copy of its own. Every page is in one of three states:

- ``FREE``: on the free list;
- ``REQUEST``: handed out by ``alloc`` and not yet given to the tree (a
  request's slots on device, a prefetch's reserved slots on host);
- ``TREE``: owned by a node of the radix tree.

Every call that takes slots back checks them against these states before
anything changes, in O(pages): whole pages, in range, listed once, and in
the state the call expects. ``SlotError`` otherwise. The states live in a
``PageTable`` (``device_pool.page_table``: numpy, or its compiled twin).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from device_pool.page_table import ALLOCATED, FREE, REQUEST, TREE, PageTable
from device_pool.slot_error import SlotError

__all__ = ["FREE", "REQUEST", "TREE", "OwnershipCounts", "PagedAllocator", "SlotError"]

_INT_TYPES = (int, np.integer)
Slots = torch.Tensor | np.ndarray  # 1-D int64; numpy from the tree, torch from callers


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
        self._table = PageTable(self.num_pages, page_size)
        # slot_grid[p] = the slots of page p (``page_slots`` hands out views of it)
        self._slot_grid = np.arange(num_tokens, dtype=np.int64).reshape(-1, page_size)
        self._slot_grid.flags.writeable = False

    @property
    def capacity(self) -> int:
        """Total slots, free or not."""
        return self.num_pages * self.page_size

    def available(self) -> int:
        """Free slots (always a multiple of ``page_size``)."""
        return self._table.num_free * self.page_size

    def request_held(self) -> int:
        """Slots handed out by ``alloc`` and not yet given to the tree or freed."""
        return self._table.request_pages * self.page_size

    def counts(self) -> OwnershipCounts:
        """Slots per state, counted from the state table (O(pages); for checks)."""
        free, request, tree = self._table.counts()
        ps = self.page_size
        return OwnershipCounts(free * ps, request * ps, tree * ps)

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Allocate ``num_tokens`` slots (a multiple of page_size), request-held."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, _INT_TYPES):
            raise TypeError(f"alloc size must be an int, got {type(num_tokens).__name__}")
        if num_tokens < 0 or num_tokens % self.page_size:
            raise ValueError(f"alloc size {num_tokens} is not a multiple of {self.page_size}")
        n = int(num_tokens) // self.page_size
        if n > self._table.num_free:
            return None
        if n == 0:
            return torch.empty(0, dtype=torch.int64)
        return torch.from_numpy(self._table.alloc(n))

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
        self._table.move(_flat(slots), REQUEST, REQUEST, True)

    def to_tree(self, slots: Slots) -> None:
        """Request-held pages pass to the tree (an insert, a load-back, a backup)."""
        self._table.move(_flat(slots), REQUEST, TREE, True)

    def commit_request(self, to_tree: Slots, to_free: Slots) -> None:
        """One checked step for a request's slots at insert: ``to_tree`` pass to
        the tree, ``to_free`` (duplicates of the tree's pages) are freed. Both
        must be request-held whole pages, no page listed twice across both;
        otherwise SlotError and nothing changes."""
        self._table.commit(_flat(to_tree), _flat(to_free))

    def free_request(self, slots: Slots) -> None:
        """Return request-held pages that never reached the tree."""
        self._table.move(_flat(slots), REQUEST, FREE, True)

    def free_tree(self, slots: Slots) -> None:
        """Return pages the tree owned (eviction, a failed copy, reset).

        The tree's slots were checked whole and distinct when they entered it
        (``to_tree``, ``commit_request``), so this checks per page only, in
        O(pages): in range, tree-owned and listed once (a double free fails
        here, within one call or across two)."""
        self._table.move(_flat(slots), TREE, FREE, False)

    def free(self, slots: Slots) -> None:
        """Return allocated pages, request-held or tree-owned (not free ones)."""
        self._table.move(_flat(slots), ALLOCATED, FREE, True)

    def whole_pages(self, slots: Slots, every_slot: bool = True) -> np.ndarray:
        """Page numbers of ``slots``; SlotError unless they form whole pages (slots
        of a page in order), in range, each page listed once. With
        ``every_slot=False`` only each page's first slot is range-checked
        (O(pages); for slots that were checked whole when handed in)."""
        pages: np.ndarray = self._table.whole_pages(_flat(slots), every_slot)
        return pages


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
