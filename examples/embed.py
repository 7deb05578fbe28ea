"""Embed the cache in an engine: match a request, pin the hit, insert what the forward pass wrote.

Runs from any directory: `python examples/embed.py` (a test runs it).
"""

import torch

from hicache import CacheConfig, HiRadixCache

cache = HiRadixCache(CacheConfig.shipped("device-only"))
tokens = list(range(100))
m = cache.match_prefix(tokens)  # what is cached already
cache.inc_lock_ref(m.last_device_node)  # pin it while we use it
new = cache.alloc_device(len(tokens) - m.device_hit_length)  # evicts if needed
slots = torch.cat([m.device_indices, new[: len(tokens) - m.device_hit_length]])
# ... the forward pass writes K/V for `tokens` at `slots` in cache.device_pool ...
cache.cache_finished_req(tokens, slots, m.last_device_node)  # insert, unlock
print(f"cached {cache.evictable_size()} tokens ({len(tokens)} asked; whole pages only)")
