"""Pools filled with random KV, and slot pickers, for the transfer tests."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from device_pool.kv_pool import DeviceKVPool
from device_pool.shape import KVShape
from host_pool.kv_pool import HostKVPool

# CUDA io backends as test parameters; "kernel" needs cupy.
IO_BACKENDS = [
    "direct",
    pytest.param(
        "kernel",
        marks=pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="needs cupy"),
    ),
]


def make_shape(
    attention: str = "mha", dtype: torch.dtype = torch.float16, layers: int = 3
) -> KVShape:
    if attention == "mla":
        return KVShape(layers, 1, 1, dtype, attention="mla", kv_lora_rank=12, rope_dim=4)
    return KVShape(layers, 2, 8, dtype)


def make_pools(
    shape: KVShape,
    page_size: int,
    layout: str,
    pages: int = 8,
    device: str = "cpu",
) -> tuple[DeviceKVPool, HostKVPool]:
    dev = DeviceKVPool(shape, pages * page_size, page_size, device=device)
    host = HostKVPool(
        shape,
        pages * page_size,
        page_size,
        layout=layout,
        pin_memory=device != "cpu",
        reserve_bytes=0,
    )
    return dev, host


def randomize(pool: DeviceKVPool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for layer in range(pool.shape.num_layers):
        for buf in pool.layer_buffers(layer):
            buf.copy_(torch.randn(buf.shape, generator=gen).to(buf.dtype))


def random_pages(capacity: int, page_size: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """Slots of ``count`` distinct random pages, in random order."""
    pages = torch.randperm(capacity // page_size, generator=gen)[:count]
    return (pages[:, None] * page_size + torch.arange(page_size)).reshape(-1)


def device_kv(pool: DeviceKVPool, layer: int, slots: torch.Tensor) -> list[torch.Tensor]:
    return [buf[slots.to(buf.device)].cpu() for buf in pool.layer_buffers(layer)]


def snapshot(pool: DeviceKVPool, slots: torch.Tensor) -> list[list[torch.Tensor]]:
    return [device_kv(pool, layer, slots) for layer in range(pool.shape.num_layers)]


def same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> bool:
    return all(
        torch.equal(x, y) for la, lb in zip(a, b, strict=True) for x, y in zip(la, lb, strict=True)
    )
