"""Page-granular slot allocator shared by the device and host pools.

It owns only indices, no memory, which is why the host pool reuses it rather
than keeping a copy of its own.
"""

from __future__ import annotations

import numpy as np
import torch


class SlotError(ValueError):
    """A slot was freed twice, never handed out, or does not form whole pages."""


class PagedAllocator:
    """Hands out whole pages of slots; slot ``s`` belongs to page ``s // page_size``.

    Mutates only itself. Not thread-safe: one owner thread calls it.
    ``alloc`` returns a fresh int64 tensor (never a view of internal state) or
    ``None`` when there are not enough free pages. ``free`` raises ``SlotError``
    for slots that are not whole, allocated pages; nothing is freed then.
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
        self._offsets = np.arange(page_size, dtype=np.int64)
        # numpy, not torch, for the bookkeeping: these arrays are small and
        # numpy's per-call overhead is a fraction of torch's.
        self._in_use = np.zeros(self.num_pages, dtype=np.bool_)
        # Reversed so that low pages go out first: easier to read in dumps.
        self._free_pages: list[int] = list(range(self.num_pages - 1, -1, -1))

    @property
    def capacity(self) -> int:
        """Total slots, free or not."""
        return self.num_pages * self.page_size

    def available(self) -> int:
        """Free slots (always a multiple of ``page_size``)."""
        return len(self._free_pages) * self.page_size

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Allocate ``num_tokens`` slots (a multiple of page_size), page by page."""
        if num_tokens < 0 or num_tokens % self.page_size:
            raise ValueError(f"alloc size {num_tokens} is not a multiple of {self.page_size}")
        n = num_tokens // self.page_size
        if n > len(self._free_pages):
            return None
        if n == 0:
            return torch.empty(0, dtype=torch.int64)
        pages = np.array(self._free_pages[-n:][::-1], dtype=np.int64)
        del self._free_pages[-n:]
        self._in_use[pages] = True
        return torch.from_numpy((pages[:, None] * self.page_size + self._offsets).reshape(-1))

    def free(self, slots: torch.Tensor) -> None:
        """Return whole pages; every slot of each page must be listed exactly once."""
        if slots.numel() == 0:
            return
        pages = self._check_whole_pages(slots)
        self._in_use[pages] = False
        self._free_pages.extend(pages.tolist())

    def _check_whole_pages(self, slots: torch.Tensor) -> np.ndarray:
        if slots.dtype != torch.int64 or slots.dim() != 1:
            raise SlotError(f"slots must be 1-D int64, got {slots.dtype} {tuple(slots.shape)}")
        flat = slots.cpu().numpy()
        if flat.size % self.page_size:
            raise SlotError(f"{flat.size} slots do not form whole pages of {self.page_size}")
        if int(flat.min()) < 0 or int(flat.max()) >= self.capacity:
            raise SlotError("slot index out of range")
        grid = flat.reshape(-1, self.page_size)
        pages = grid[:, 0] // self.page_size
        if self.page_size > 1 and not np.array_equal(
            grid, pages[:, None] * self.page_size + self._offsets
        ):
            raise SlotError("slots are not whole pages in order")
        if not self._in_use[pages].all():
            raise SlotError("freeing a page that is not allocated (double free?)")
        if pages.size > 1 and np.unique(pages).size != pages.size:
            raise SlotError("a page is listed twice")
        return pages
