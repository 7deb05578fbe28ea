"""Build what a CacheConfig describes: the pools, the transfer engine, and the parts
``HiRadixCache`` is composed of (``build_parts``)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Literal, NamedTuple

import torch

from device_pool import DeviceKVPool, tokens_for_bytes
from hicache.config.cache import CacheConfig
from hicache.keys.hashing import NodeKeys, model_fingerprint
from hicache.lifecycle import Lifecycle
from hicache.observe.observer import Observer
from hicache.observe.prometheus import Gauges
from hicache.policies.eviction import create_eviction_policy
from hicache.policies.rates import Clock
from hicache.tiers.host import HostTier
from hicache.tiers.residency import ResidencyTree
from hicache.tiers.storage import StorageTier
from hicache.tree.radix_tree import TreeNode
from host_pool import HostKVPool
from storage_backends import StorageBackend
from storage_backends.guard import GuardedBackend, open_guarded
from transfer import TransferEngine, create_transfer_engine
from transfer.storage_io import StorageIO

SplitHook = Callable[[TreeNode, TreeNode], None]  # a split node's upper and lower halves


class CacheParts(NamedTuple):
    """The parts of one cache, built and registered with its lifecycle."""

    device_pool: DeviceKVPool
    host_pool: HostKVPool | None
    fingerprint: bytes
    keys: NodeKeys
    residency: ResidencyTree
    host: HostTier | None
    store: StorageTier | None
    observer: Observer


class Given(NamedTuple):
    """What a caller of ``HiRadixCache`` may pass instead of building it from the config."""

    device_pool: DeviceKVPool | None
    host_pool: HostKVPool | None
    transfer: TransferEngine | None
    storage: StorageBackend | None


def build_parts(
    config: CacheConfig,
    given: Given,
    life: Lifecycle,
    clock: Clock,
    on_split: SplitHook,
    gauges: Callable[[], Gauges],
) -> CacheParts:
    """Build every part ``given`` does not supply, each registered with ``life`` as it
    starts (so a failure half-way releases what was started, in reverse order).
    ValueError for pools that do not fit the config."""
    ps = config.device.page_size
    device_pool = given.device_pool or build_device_pool(config)
    if device_pool.page_size != ps:
        raise ValueError("device pool page_size differs from device.page_size")
    host_pool = given.host_pool or build_host_pool(config, device_pool)
    if given.host_pool is None and host_pool is not None:
        # Built here, so ours to unpin; released last (after the copy engine).
        life.started(host_pool.close)
    fingerprint = model_fingerprint(config.model, ps)
    keys = NodeKeys(fingerprint, ps)
    evict_policy = create_eviction_policy(config.policy.eviction)
    residency = ResidencyTree(ps, device_pool.allocator, evict_policy, on_split)
    host: HostTier | None = None
    if host_pool is not None:
        engine = given.transfer or build_transfer(config, device_pool, host_pool)
        life.started(engine.close)
        host = HostTier(host_pool, engine, residency.tree, evict_policy)
        life.started(host.close)
    store = _build_storage(config, given.storage, host_pool, fingerprint, life, clock)
    observer = Observer(config, keys, gauges, clock)
    life.started(observer.close)
    return CacheParts(device_pool, host_pool, fingerprint, keys, residency, host, store, observer)


def _build_storage(
    config: CacheConfig,
    backend: StorageBackend | None,
    host_pool: HostKVPool | None,
    fingerprint: bytes,
    life: Lifecycle,
    clock: Clock,
) -> StorageTier | None:
    cfg = config.storage
    if backend is None and not cfg.enabled:
        return None
    if host_pool is None:
        raise ValueError("the storage tier needs the host tier")
    # Behind the guard, a failing or damaged store costs hits, never the engine.
    if backend is None:
        named = dataclasses.replace(cfg, fingerprint=fingerprint.hex())
        guarded = open_guarded(cfg.backend, named)
    else:
        guarded = GuardedBackend(backend, None, cfg.timeout_s)
    io = StorageIO(guarded, host_pool, config.policy.io_workers, clock)
    life.started(functools.partial(io.close, cfg.timeout_s))
    return StorageTier(io, config.device.page_size, cfg.timeout_s, clock)


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
