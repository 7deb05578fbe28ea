"""Small builders shared by the hicache tests."""

from __future__ import annotations

import torch

from hicache.cache import HiRadixCache
from hicache.config.cache import CacheConfig, DeviceConfig, HostConfig, ModelConfig, PolicyConfig
from hicache.factory import build_device_pool, build_host_pool
from hicache.tree.radix_tree import TreeNode
from storage_backends import StorageConfig
from transfer import CpuTransferEngine, FaultInjection


def device_only(page_size: int = 4, pages: int = 64, eviction: str = "lru") -> HiRadixCache:
    cfg = CacheConfig(
        model=ModelConfig(num_layers=2, kv_heads=1, head_dim=4, dtype="float32"),
        device=DeviceConfig(device="cpu", page_size=page_size, num_tokens=pages * page_size),
        host=HostConfig(enabled=False),
        policy=PolicyConfig(eviction=eviction),
    )
    return HiRadixCache(cfg)


def run_request(
    cache: HiRadixCache,
    tokens: list[int],
    namespace: str | None = None,
    finish: bool = True,
    priority: int = 0,
) -> TreeNode:
    """Match, lock, allocate the uncached part, 'compute' it, and cache it."""
    m = cache.match_prefix(tokens, namespace)
    cache.inc_lock_ref(m.last_device_node)
    hit = m.device_hit_length
    new = cache.alloc_device(len(tokens) - hit)
    assert new is not None, "test pool too small"
    slots = torch.cat([m.device_indices, new[: len(tokens) - hit]])
    if finish:
        cache.cache_finished_req(tokens, slots, m.last_device_node, namespace, priority=priority)
        cache.check_integrity()
        return m.last_device_node
    res = cache.cache_unfinished_req(
        tokens, slots, m.last_device_node, namespace, priority=priority
    )
    cache.check_integrity()
    return res.last_node


def two_tier(
    page_size: int = 4,
    pages: int = 16,
    host_ratio: float = 2.0,
    write_policy: str = "write_through",
    layout: str = "layer_first",
    attention: str = "mha",
    dtype: str = "float32",
    faults: FaultInjection | None = None,
    load_back_threshold: int = 1,
    storage: StorageConfig | None = None,
    prefetch_policy: str = "wait_complete",
    prefetch_threshold: int = 1,
) -> HiRadixCache:
    """Device + host (+ storage), with a CPU transfer engine (optionally
    fault-injecting)."""
    cfg = CacheConfig(
        model=ModelConfig(
            num_layers=2,
            kv_heads=2,
            head_dim=4,
            dtype=dtype,
            attention=attention,
            kv_lora_rank=6 if attention == "mla" else 0,
            rope_dim=2 if attention == "mla" else 0,
        ),
        device=DeviceConfig(device="cpu", page_size=page_size, num_tokens=pages * page_size),
        host=HostConfig(enabled=True, ratio=host_ratio, layout=layout, reserve_gb=0.0),
        policy=PolicyConfig(
            write_policy=write_policy,
            load_back_threshold=load_back_threshold,
            write_through_threshold=2,
            prefetch_policy=prefetch_policy,
            prefetch_threshold=prefetch_threshold,
        ),
        storage=storage or StorageConfig(),
    )
    device = build_device_pool(cfg)
    host = build_host_pool(cfg, device)
    assert host is not None
    return HiRadixCache(cfg, device, host, CpuTransferEngine(device, host, faults=faults))


def expected_kv(cache: HiRadixCache, tokens: list[int], layer: int, buf: int) -> torch.Tensor:
    """Deterministic KV for ``tokens`` at positions 0.., exact in every dtype."""
    shape = cache.device_pool.shape
    h, d = shape.token_shape
    tok = torch.tensor(tokens, dtype=torch.int64)
    pos = torch.arange(len(tokens), dtype=torch.int64)
    base = tok * 31 + pos * 17 + layer * 13 + buf * 7
    grid = base[:, None] + torch.arange(h * d, dtype=torch.int64)
    return (grid % 251).reshape(len(tokens), h, d).to(shape.dtype)


def write_kv(cache: HiRadixCache, tokens: list[int], start: int, slots: torch.Tensor) -> None:
    """'Forward pass': write KV of ``tokens[start:]`` at ``slots``."""
    pool = cache.device_pool
    for layer in range(pool.shape.num_layers):
        values = [
            expected_kv(cache, tokens, layer, b)[start:] for b in range(pool.shape.kv_per_layer)
        ]
        pool.set_kv(layer, slots, *values)


def check_kv(cache: HiRadixCache, tokens: list[int], slots: torch.Tensor) -> None:
    """KV at ``slots`` is exactly what ``write_kv`` wrote for ``tokens[:len(slots)]``."""
    pool = cache.device_pool
    n = slots.numel()
    for layer in range(pool.shape.num_layers):
        cache.wait_layer(layer)
        for b, buf in enumerate(pool.layer_buffers(layer)):
            want = expected_kv(cache, tokens[:n], layer, b)
            assert torch.equal(buf[slots], want), f"KV mismatch in layer {layer} buffer {b}"


def fetch_from_storage(cache: HiRadixCache, tokens: list[int], namespace: str | None) -> int:
    """Prefetch what storage holds past the host match and wait for it."""
    m = cache.match_prefix(tokens, namespace)
    if cache.prefetch("req", tokens, namespace, m.last_host_node) == 0:
        return 0
    cache.drain()
    status = cache.check_prefetch("req")
    assert status.done and status.ready
    cache.release_prefetch("req")
    return status.fetched_tokens


def serve(
    cache: HiRadixCache,
    tokens: list[int],
    namespace: str | None = None,
    kv_ids: list[int] | None = None,
) -> int:
    """One request the way an engine runs it, checking reused KV bit for bit.
    Returns the tokens it reused (device + loaded back, storage included).
    ``kv_ids``: the ids whose KV the 'forward pass' writes (default ``tokens``),
    so that equal tokens can carry different KV (one per namespace)."""
    kv_ids = tokens if kv_ids is None else kv_ids
    if cache.storage is not None:
        fetch_from_storage(cache, tokens, namespace)
    prefix, last, _ = cache.admit(cache.match_prefix(tokens, namespace))
    cache.start_loading()
    check_kv(cache, kv_ids, prefix)
    n_new = len(tokens) - prefix.numel()
    new = cache.alloc_device(n_new)
    assert new is not None, "test pool too small"
    write_kv(cache, kv_ids, prefix.numel(), new[:n_new])
    cache.cache_finished_req(tokens, torch.cat([prefix, new[:n_new]]), last, namespace)
    cache.poll()
    cache.check_integrity()
    return int(prefix.numel())
