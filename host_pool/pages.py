"""Whole-page byte views of a host pool, the unit of storage I/O."""

from __future__ import annotations

from collections.abc import Callable

import torch


class PageSink:
    """Writable destination for whole pages coming back from storage.

    ``views`` holds one writable memoryview per page, in the order the slots
    were given, each laid out in the pool's canonical page order. Fill them,
    then call ``commit()`` once: it makes the bytes visible in the pool (a
    scatter for ``layer_first``; a no-op for ``page_first``, whose views are
    pool memory already). Not thread-safe; the views must not be used after
    ``commit()``. ``commit()`` raises RuntimeError if called twice.
    """

    def __init__(self, views: list[memoryview], commit: Callable[[], None] | None) -> None:
        self.views = views
        self._commit = commit
        self._committed = False

    def commit(self) -> None:
        if self._committed:
            raise RuntimeError("PageSink.commit() called twice")
        self._committed = True
        if self._commit is not None:
            self._commit()


def whole_pages(slots: torch.Tensor, page_size: int, capacity: int) -> torch.Tensor:
    """Page indices of ``slots``, which must list whole pages in order; ValueError otherwise."""
    if slots.dtype != torch.int64 or slots.dim() != 1:
        raise ValueError(
            f"slots must be a 1-D int64 tensor, got {slots.dtype} {tuple(slots.shape)}"
        )
    if slots.numel() % page_size:
        raise ValueError(f"{slots.numel()} slots do not form whole pages of {page_size}")
    if slots.numel() == 0:
        return slots.clone()
    if int(slots.min()) < 0 or int(slots.max()) >= capacity:
        raise ValueError(f"slot out of range [0, {capacity})")
    grid = slots.view(-1, page_size)
    pages = grid[:, 0] // page_size
    expected = pages[:, None] * page_size + torch.arange(page_size, dtype=torch.int64)
    if not torch.equal(grid, expected):
        raise ValueError("slots are not whole pages in order")
    return pages


def byte_rows(tensor: torch.Tensor) -> torch.Tensor:
    """``[n, ...]`` contiguous tensor as ``[n, bytes]`` uint8 (bfloat16 has no numpy dtype)."""
    return tensor.reshape(tensor.shape[0], -1).view(torch.uint8)
