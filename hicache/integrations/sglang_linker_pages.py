"""SGLang's device KV pools read and written by whole pages, for ``HicacheLinker``.

SGLang 0.5.23's ``resolve_hybrid_device_pool_group`` offers no direct-linker
view of plain MHA/MLA pools, so the linker addresses them itself:
``MHATokenToKVPool.k_buffer`` / ``v_buffer`` (one ``(rows, heads, dim)``
tensor per layer) and ``MLATokenToKVPool.kv_buffer`` (``(rows, 1, dim)``).
Rows are slots; rows ``0..page_size-1`` are SGLang's padding page, never
handed out, so a slot is its own row and page ``p`` is rows ``p*page_size``
onwards.

A stored page has the bytes of SGLang's host pool's flat data page in one
host layout (``get_data_page(flat=True)``), so the L3 adapter, whose pages
are those flat pages, and the linker read each other's pages when their
layouts agree:

=====  ============  ==================================
kind   layout        flat page shape
=====  ============  ==================================
mha    layer_first   (2, layers, page_size, heads, dim)
mha    page_first    (2, page_size, layers, heads, dim)
mla    layer_first   (layers, page_size, 1, dim)
mla    page_first    (page_size, layers, 1, dim)
=====  ============  ==================================

``DevicePages`` copies one layer of a batch of pages between the device pool
and a staging tensor ``(pages, *flat page shape)``; it holds no state beyond
the pool's buffers and is safe to call from any one thread at a time per
staging tensor (SGLang only frees slots after the linker reports the copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Kind = Literal["mha", "mla"]
LAYOUTS = ("page_first", "layer_first")


@dataclass(frozen=True)
class PageShape:
    """The geometry of one stored page."""

    kind: Kind
    layout: str
    layers: int
    page_size: int
    heads: int
    dim: int
    dtype: torch.dtype

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if min(self.layers, self.page_size, self.heads, self.dim) < 1:
            raise ValueError(f"page geometry must be positive, got {self}")

    @property
    def shape(self) -> tuple[int, ...]:
        """The flat page's logical shape (see the module doc)."""
        ps, ly, h, d = self.page_size, self.layers, self.heads, self.dim
        if self.kind == "mha":
            return (2, ly, ps, h, d) if self.layout == "layer_first" else (2, ps, ly, h, d)
        return (ly, ps, 1, d) if self.layout == "layer_first" else (ps, ly, 1, d)

    @property
    def elements(self) -> int:
        n = 1
        for size in self.shape:
            n *= size
        return n

    @property
    def nbytes(self) -> int:
        return self.elements * self.dtype.itemsize

    @property
    def parts(self) -> int:
        """Tensors per layer: K and V (MHA) or the latent buffer (MLA)."""
        return 2 if self.kind == "mha" else 1

    def layer_view(self, staging: torch.Tensor, layer: int, part: int) -> torch.Tensor:
        """``(pages, page_size, heads, dim)`` view of one layer's K/V (or latent)
        in a staging tensor of shape ``(pages, *shape)``."""
        if self.kind == "mha":
            return (
                staging[:, part, layer]
                if self.layout == "layer_first"
                else staging[:, part, :, layer]
            )
        return staging[:, layer] if self.layout == "layer_first" else staging[:, :, layer]


def pool_kind(kvcache: object) -> Kind:
    """``mha`` for a pool with per-layer ``k_buffer``/``v_buffer``, ``mla`` for one with
    per-layer ``kv_buffer``; ValueError for any other pool (SWA, Mamba, DSA, ...)."""
    name = type(kvcache).__name__
    if name == "MHATokenToKVPool" and isinstance(getattr(kvcache, "k_buffer", None), list):
        return "mha"
    if name == "MLATokenToKVPool" and isinstance(getattr(kvcache, "kv_buffer", None), list):
        return "mla"
    raise ValueError(
        f"the hicache linker supports SGLang's MHATokenToKVPool and MLATokenToKVPool; "
        f"got {name} (hybrid SWA/Mamba/DSA pools are not supported yet)"
    )


class DevicePages:
    """Page-granular access to one SGLang device pool (see the module doc)."""

    def __init__(self, kvcache: object, page_size: int, layout: str) -> None:
        self.kind = pool_kind(kvcache)
        layers: list[list[torch.Tensor]]
        if self.kind == "mha":
            ks, vs = kvcache.k_buffer, kvcache.v_buffer  # type: ignore[attr-defined]
            layers = [[k, v] for k, v in zip(ks, vs, strict=True)]
            if ks[0].shape != vs[0].shape:
                raise ValueError(
                    f"K and V rows differ ({tuple(ks[0].shape)} vs {tuple(vs[0].shape)}); "
                    "the hicache linker stores pages whose K and V have one shape"
                )
        else:
            layers = [[kv] for kv in kvcache.kv_buffer]  # type: ignore[attr-defined]
        first = layers[0][0]
        rows, heads, dim = first.shape
        if rows % page_size:
            raise ValueError(f"device pool rows {rows} are not whole pages of {page_size}")
        self.shape = PageShape(self.kind, layout, len(layers), page_size, heads, dim, first.dtype)
        self.device = first.device
        self.pages = rows // page_size
        # Per layer, per part: the buffer viewed as (pages, page_size, heads, dim).
        self._views = [
            [b.view(self.pages, page_size, heads, dim) for b in parts] for parts in layers
        ]

    def page_ids(self, slots: torch.Tensor, pages: int) -> torch.Tensor:
        """The device pages that ``slots`` cover, one per ``page_size`` slots in order;
        ValueError unless they are ``pages`` whole, aligned pages of this pool."""
        ps = self.shape.page_size
        if slots.dim() != 1 or slots.numel() != pages * ps:
            raise ValueError(f"{pages} pages need {pages * ps} device slots, got {slots.shape}")
        flat = slots.detach().to("cpu", torch.int64)
        starts = flat[::ps]
        aligned = bool(((starts % ps) == 0).all()) and bool(
            (flat.view(pages, ps) == starts[:, None] + torch.arange(ps)).all()
        )
        ids = starts // ps
        if not aligned or (pages and (int(ids.min()) < 1 or int(ids.max()) >= self.pages)):
            raise ValueError("device slots must be whole, aligned pages of the pool (not page 0)")
        return ids

    def staging(self, pages: int, pin: bool) -> torch.Tensor:
        """A staging tensor for ``pages`` pages (pinned host memory when asked)."""
        return torch.empty((pages, *self.shape.shape), dtype=self.shape.dtype, pin_memory=pin)

    def read_layer(self, layer: int, ids: torch.Tensor, staging: torch.Tensor) -> None:
        """Copy layer ``layer`` of device pages ``ids`` into ``staging`` (blocking on CPU;
        on a GPU the caller synchronises its current stream before using ``staging``)."""
        for part, view in enumerate(self._views[layer]):
            src = view.index_select(0, ids.to(self.device))
            self.shape.layer_view(staging, layer, part).copy_(src, non_blocking=True)

    def write_layer(self, layer: int, ids: torch.Tensor, staged: torch.Tensor) -> None:
        """Copy layer ``layer`` of ``staged`` (on the pool's device) into device pages ``ids``."""
        dev_ids = ids.to(self.device)
        for part, view in enumerate(self._views[layer]):
            view.index_copy_(0, dev_ids, self.shape.layer_view(staged, layer, part))
