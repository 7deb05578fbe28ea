"""Page alignment: the one home for rounding token counts and slots to pages."""

from __future__ import annotations

import torch


def align_down(num_tokens: int, page_size: int) -> int:
    """Tokens in the whole pages of ``num_tokens`` (a trailing partial page dropped)."""
    return num_tokens // page_size * page_size


def align_up(num_tokens: int, page_size: int) -> int:
    """Tokens in the pages needed to hold ``num_tokens``."""
    return -(-num_tokens // page_size) * page_size


class PageTable:
    """Every page's slots, precomputed: ``of(slot)`` is one indexing op."""

    def __init__(self, capacity: int, page_size: int) -> None:
        self._grid = torch.arange(capacity, dtype=torch.int64).view(-1, page_size)
        self.page_size = page_size

    def of(self, slot: int) -> torch.Tensor:
        """The slots of the page that holds ``slot`` (a view: read, never
        write); ValueError for a slot outside the pool."""
        page = slot // self.page_size
        if not 0 <= page < self._grid.shape[0]:
            raise ValueError(f"slot {slot} is outside the pool")
        return self._grid[page]


def empty_slots() -> torch.Tensor:
    """A fresh empty int64 slot tensor."""
    return torch.empty(0, dtype=torch.int64)
