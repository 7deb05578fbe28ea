"""Host KV buffers in one of two layouts, plus the host tier's page allocator."""

from __future__ import annotations

import weakref
from typing import Literal, get_args

import torch

from device_pool.allocator import PagedAllocator
from device_pool.shape import KVShape
from host_pool.memory import PinnedRegistration, allocate_host, check_host_memory, pinned_size
from host_pool.pages import PageSink, byte_rows, whole_pages

HostLayout = Literal["layer_first", "page_first"]
LAYOUTS: tuple[str, ...] = get_args(HostLayout)


class HostKVPool:
    """KV memory of the host tier (pinned when asked) and its page allocator.

    Layouts of the single backing tensor:

    - ``layer_first``: ``[kv_per_layer, num_layers, size, *token_shape]`` — a
      layer's tokens are contiguous, like the device pool.
    - ``page_first``: ``[num_pages, num_layers, kv_per_layer, page_size, *token_shape]``
      — one page of all layers is one contiguous byte range, for storage I/O.

    A page's *canonical bytes* are ``[num_layers, kv_per_layer, page_size,
    *token_shape]`` in C order, whatever the layout, so pages move between
    pools of either layout through storage unchanged.

    Pinned pools are pageable memory registered with CUDA (exactly
    ``pinned_nbytes``, see ``host_pool.memory``); ``close`` (or garbage
    collection) unregisters it, after every engine copying through the pool
    was closed.

    Mutation: ``write_layer``, ``PageSink.commit`` and page_first sink views
    write KV; ``allocator`` hands out slots. Not thread-safe for allocation
    (one owner thread); copy workers may read and write disjoint slots.
    Raises ``HostMemoryError`` at construction when the buffer would not fit
    in available RAM minus ``reserve_bytes``; ValueError for bad arguments
    (``pin_memory=True`` without CUDA); RuntimeError when CUDA cannot pin.
    """

    def __init__(
        self,
        shape: KVShape,
        num_tokens: int,
        page_size: int,
        layout: str = "layer_first",
        pin_memory: bool = False,
        reserve_bytes: int = 1 << 30,
    ) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self._shape = shape
        self._page_size = page_size
        self._layout = layout
        self._num_pages = num_tokens // page_size
        self._size = self._num_pages * page_size
        dims = self._tensor_shape()
        nbytes = _numel(dims) * shape.element_size
        if pin_memory and not torch.cuda.is_available():
            raise ValueError("pin_memory=True needs CUDA, which is not available")
        # Checked before the allocator too: its free list is itself O(pages) memory.
        check_host_memory(pinned_size(nbytes) if pin_memory else nbytes, reserve_bytes)
        self.allocator = PagedAllocator(self._size, page_size)
        self._data = allocate_host(dims, shape.dtype, page_aligned=pin_memory)
        self._pinned = PinnedRegistration(self._data, pin_memory)
        self._finalizer = weakref.finalize(self, self._pinned.release)

    def _tensor_shape(self) -> tuple[int, ...]:
        s = self._shape
        if self._layout == "layer_first":
            return (s.kv_per_layer, s.num_layers, self._size, *s.token_shape)
        return (self._num_pages, s.num_layers, s.kv_per_layer, self._page_size, *s.token_shape)

    @property
    def shape(self) -> KVShape:
        return self._shape

    @property
    def size(self) -> int:
        """Capacity in tokens (a multiple of page_size)."""
        return self._size

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def num_pages(self) -> int:
        return self._num_pages

    @property
    def layout(self) -> str:
        return self._layout

    @property
    def nbytes(self) -> int:
        return self._data.numel() * self._data.element_size()

    @property
    def page_nbytes(self) -> int:
        """Bytes of one page across all layers and buffers."""
        return self._shape.bytes_per_token * self._page_size

    @property
    def is_pinned(self) -> bool:
        return self._pinned.nbytes > 0

    @property
    def pinned_nbytes(self) -> int:
        """Bytes of host memory this pool has page-locked (0 when pageable or closed)."""
        return self._pinned.nbytes

    def close(self) -> None:
        """Unregister pinned memory (the pool stays usable, pageable); idempotent.

        Copy engines and kernels that use this pool must be closed first.
        """
        self._finalizer()

    @property
    def data(self) -> torch.Tensor:
        """The backing tensor, in this pool's layout (for copy engines and kernels)."""
        return self._data

    def layer_pages(self, layer: int) -> tuple[torch.Tensor, ...]:
        """Per buffer of ``layer``: a view ``[num_pages, page_size, *token_shape]``.

        Each page's block is contiguous in both layouts; pages are strided.
        """
        s = self._shape
        if self._layout == "layer_first":
            return tuple(
                self._data[k, layer].view(self._num_pages, self._page_size, *s.token_shape)
                for k in range(s.kv_per_layer)
            )
        return tuple(self._data[:, layer, k] for k in range(s.kv_per_layer))

    def read_layer(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Copies of ``layer``'s KV at ``slots``: per buffer ``[n, *token_shape]``."""
        self._check_slots(slots)
        if self._layout == "layer_first":
            return tuple(
                self._data[k, layer].index_select(0, slots) for k in range(self._shape.kv_per_layer)
            )
        pages, offsets = slots // self._page_size, slots % self._page_size
        return tuple(view[pages, offsets] for view in self.layer_pages(layer))

    def write_layer(
        self, layer: int, slots: torch.Tensor, values: tuple[torch.Tensor, ...]
    ) -> None:
        """Write one ``[n, *token_shape]`` value per buffer of ``layer`` at ``slots``."""
        self._check_slots(slots)
        if len(values) != self._shape.kv_per_layer:
            raise ValueError(f"layer has {self._shape.kv_per_layer} buffers, got {len(values)}")
        if self._layout == "layer_first":
            for k, value in enumerate(values):
                self._data[k, layer].index_copy_(0, slots, value.to(self._shape.dtype))
            return
        pages, offsets = slots // self._page_size, slots % self._page_size
        for view, value in zip(self.layer_pages(layer), values, strict=True):
            view[pages, offsets] = value.to(self._shape.dtype)

    def page_bytes(self, slots: torch.Tensor) -> list[memoryview]:
        """One read-only memoryview of canonical bytes per page of ``slots`` (whole pages).

        page_first: zero-copy views of pool memory (they see later writes).
        layer_first: views of one gathered copy.
        """
        pages = whole_pages(slots, self._page_size, self._size)
        if self._layout == "page_first":
            rows = byte_rows(self._data).numpy()
            return [memoryview(rows[p]).toreadonly() for p in pages.tolist()]
        rows = byte_rows(self._page_major()[pages]).numpy()
        return [memoryview(row).toreadonly() for row in rows]

    def page_sink(self, slots: torch.Tensor) -> PageSink:
        """Writable canonical-byte views for the pages of ``slots`` (whole pages)."""
        pages = whole_pages(slots, self._page_size, self._size)
        if self._layout == "page_first":
            rows = byte_rows(self._data).numpy()
            return PageSink([memoryview(rows[p]) for p in pages.tolist()], None)
        staged = torch.empty(
            (pages.numel(), *self._page_major().shape[1:]), dtype=self._shape.dtype
        )

        def scatter() -> None:
            self._page_major()[pages] = staged

        return PageSink([memoryview(row) for row in byte_rows(staged).numpy()], scatter)

    def _page_major(self) -> torch.Tensor:
        """layer_first data viewed as ``[num_pages, num_layers, kv, page_size * token]``."""
        s = self._shape
        grouped = self._data.view(s.kv_per_layer, s.num_layers, self._num_pages, -1)
        return grouped.permute(2, 1, 0, 3)

    def _check_slots(self, slots: torch.Tensor) -> None:
        if slots.dtype != torch.int64 or slots.dim() != 1:
            raise ValueError(f"slots must be a 1-D int64 tensor, got {slots.dtype}")
        if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= self._size):
            raise ValueError(f"slot out of range [0, {self._size})")


def _numel(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n
