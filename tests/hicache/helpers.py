"""Small builders shared by the hicache tests."""

from __future__ import annotations

import torch

from hicache.cache import HiRadixCache
from hicache.config import CacheConfig, DeviceConfig, HostConfig, ModelConfig, PolicyConfig
from hicache.radix_tree import TreeNode


def device_only(page_size: int = 4, pages: int = 64, eviction: str = "lru") -> HiRadixCache:
    cfg = CacheConfig(
        model=ModelConfig(num_layers=2, kv_heads=1, head_dim=4, dtype="float32"),
        device=DeviceConfig(device="cpu", page_size=page_size, num_tokens=pages * page_size),
        host=HostConfig(enabled=False),
        policy=PolicyConfig(eviction=eviction),
    )
    return HiRadixCache(cfg)


def run_request(
    cache: HiRadixCache, tokens: list[int], namespace: str | None = None, finish: bool = True
) -> TreeNode:
    """Match, lock, allocate the uncached part, 'compute' it, and cache it."""
    m = cache.match_prefix(tokens, namespace)
    cache.inc_lock_ref(m.last_device_node)
    hit = m.device_hit_length
    new = cache.alloc_device(len(tokens) - hit)
    assert new is not None, "test pool too small"
    slots = torch.cat([m.device_indices, new[: len(tokens) - hit]])
    if finish:
        cache.cache_finished_req(tokens, slots, m.last_device_node, namespace)
        cache.check_integrity()
        return m.last_device_node
    res = cache.cache_unfinished_req(tokens, slots, m.last_device_node, namespace)
    cache.check_integrity()
    return res.last_node
