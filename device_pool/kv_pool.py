"""Device KV buffers: per layer K and V (MHA) or one latent buffer (MLA)."""

from __future__ import annotations

import torch

from device_pool.allocator import PagedAllocator
from device_pool.shape import KVShape


def resolve_device(device: str | torch.device) -> torch.device:
    """Turn ``"auto"`` into cuda when available, else cpu; checked at call time only.

    A CUDA device always comes back indexed (``cuda`` is the current device
    now), so later calls on other threads or devices never re-resolve it.
    """
    if isinstance(device, str) and device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
    if dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return dev


def tokens_for_bytes(shape: KVShape, num_bytes: int, page_size: int) -> int:
    """The most whole-page tokens whose KV fits in ``num_bytes``."""
    pages = num_bytes // (shape.bytes_per_token * page_size)
    if pages < 1:
        raise ValueError(f"{num_bytes} bytes do not hold one page of {page_size} tokens")
    return pages * page_size


class DeviceKVPool:
    """KV memory of the device tier plus its page allocator.

    ``layer_buffers(i)`` gives layer i's buffers, each ``[size, *token_shape]``
    (``(K, V)`` for MHA, ``(latent,)`` for MLA). Slot ``s`` of every buffer is
    one token. Writes go through ``set_kv``; the pool never reads or copies on
    its own. Not thread-safe for allocation; buffers may be read by copy workers.
    """

    def __init__(
        self,
        shape: KVShape,
        num_tokens: int,
        page_size: int,
        device: str | torch.device = "auto",
    ) -> None:
        self.shape = shape
        self.page_size = page_size
        self.device = resolve_device(device)
        self.allocator = PagedAllocator(num_tokens, page_size)
        self.size = self.allocator.capacity
        self._buffers: list[tuple[torch.Tensor, ...]] = [
            tuple(
                torch.zeros((self.size, *shape.token_shape), dtype=shape.dtype, device=self.device)
                for _ in range(shape.kv_per_layer)
            )
            for _ in range(shape.num_layers)
        ]

    @property
    def nbytes(self) -> int:
        return self.size * self.shape.bytes_per_token

    def layer_buffers(self, layer: int) -> tuple[torch.Tensor, ...]:
        return self._buffers[layer]

    def k_buffer(self, layer: int) -> torch.Tensor:
        return self._mha_buffers(layer)[0]

    def v_buffer(self, layer: int) -> torch.Tensor:
        return self._mha_buffers(layer)[1]

    def kv_buffer(self, layer: int) -> torch.Tensor:
        """MLA: the latent buffer of ``layer``."""
        if self.shape.attention != "mla":
            raise ValueError("kv_buffer() is for MLA pools; use k_buffer/v_buffer")
        return self._buffers[layer][0]

    def set_kv(self, layer: int, slots: torch.Tensor, *values: torch.Tensor) -> None:
        """Write one value per buffer of ``layer`` (K and V, or the latent) at ``slots``."""
        bufs = self._buffers[layer]
        if len(values) != len(bufs):
            raise ValueError(f"layer has {len(bufs)} buffers, got {len(values)} values")
        for buf, val in zip(bufs, values, strict=True):
            buf[slots] = val.to(buf.dtype)

    def _mha_buffers(self, layer: int) -> tuple[torch.Tensor, ...]:
        if self.shape.attention != "mha":
            raise ValueError("k_buffer/v_buffer are for MHA pools; use kv_buffer")
        return self._buffers[layer]
