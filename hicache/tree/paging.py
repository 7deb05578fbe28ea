"""Page alignment: the one home for rounding token counts and slots to pages."""

from __future__ import annotations

import torch


def align_down(num_tokens: int, page_size: int) -> int:
    """Tokens in the whole pages of ``num_tokens`` (a trailing partial page dropped)."""
    return num_tokens // page_size * page_size


def align_up(num_tokens: int, page_size: int) -> int:
    """Tokens in the pages needed to hold ``num_tokens``."""
    return -(-num_tokens // page_size) * page_size


def empty_slots() -> torch.Tensor:
    """A fresh empty int64 slot tensor."""
    return torch.empty(0, dtype=torch.int64)
