"""Build the pools and the transfer engine that a CacheConfig describes."""

from __future__ import annotations

from typing import Literal

import torch

from device_pool import DeviceKVPool, tokens_for_bytes
from hicache.config.cache import CacheConfig
from host_pool import HostKVPool
from transfer import TransferEngine, create_transfer_engine


def build_device_pool(config: CacheConfig) -> DeviceKVPool:
    shape = config.model.kv_shape()
    dev = config.device
    tokens = dev.num_tokens or tokens_for_bytes(shape, int(dev.size_gb * (1 << 30)), dev.page_size)
    return DeviceKVPool(shape, tokens, dev.page_size, dev.device)


def build_host_pool(config: CacheConfig, device_pool: DeviceKVPool) -> HostKVPool | None:
    """The host pool, or None when the host tier is disabled."""
    host = config.host
    if not host.enabled:
        return None
    ps = device_pool.page_size
    if host.size_gb > 0:
        tokens = tokens_for_bytes(device_pool.shape, int(host.size_gb * (1 << 30)), ps)
    else:
        tokens = max(int(device_pool.size * host.ratio) // ps * ps, ps)
    return HostKVPool(
        device_pool.shape,
        tokens,
        ps,
        layout=host.layout,
        pin_memory=device_pool.device.type == "cuda",
        reserve_bytes=int(host.reserve_gb * (1 << 30)),
    )


def build_transfer(
    config: CacheConfig, device_pool: DeviceKVPool, host_pool: HostKVPool
) -> TransferEngine:
    backend = config.transfer.backend
    if backend == "auto":
        backend = "cuda" if device_pool.device.type == "cuda" else "cpu"
    if backend == "cuda" and not torch.cuda.is_available():
        raise ValueError("transfer.backend = 'cuda' but CUDA is not available")
    io_backend: Literal["direct", "kernel"] = (
        "kernel" if config.transfer.io_backend == "kernel" else "direct"
    )
    return create_transfer_engine(
        device_pool,
        host_pool,
        backend=backend,
        num_workers=config.transfer.workers,
        io_backend=io_backend,
    )
