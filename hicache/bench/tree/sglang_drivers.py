"""Drive SGLang's trees as its scheduler does (imported by ``sglang_trees.load``
only, with SGLang's unused GPU imports stood in for).

Per request, as SGLang 0.5.23's scheduler and ``cache_finished_req`` do on
one tree: match the request's ``RadixKey``, lock the match's node, read the
prefix's slots off its path, evict then allocate whole pages for the rest,
insert the page-aligned key with a copy of its slots, free the request's
duplicates of what the tree already held and its partial last page, unlock.
"""

from __future__ import annotations

from array import array

import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from hicache.tree.paging import align_up


def _params(page_size: int, capacity: int) -> CacheInitParams:
    alloc: TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator
    if page_size == 1:
        alloc = TokenToKVPoolAllocator(capacity, torch.float16, "cpu", None, False)
    else:
        alloc = PagedTokenToKVPoolAllocator(capacity, page_size, torch.float16, "cpu", None, False)
    return CacheInitParams(
        disable=False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=alloc,
        page_size=page_size,
        tree_components=(ComponentType.FULL,),
    )


class RadixDriver:
    """SGLang's pure-Python ``RadixCache``; the caller frees duplicates."""

    name = "sglang-radix"

    def __init__(self, tree: RadixCache | UnifiedRadixCache, params: CacheInitParams) -> None:
        self.tree = tree
        self.allocator = params.token_to_kv_pool_allocator
        self.page_size = params.page_size

    @classmethod
    def build(cls, page_size: int, capacity: int) -> RadixDriver:
        params = _params(page_size, capacity)
        return cls(RadixCache(params), params)

    def match(self, key: array) -> tuple[int, object]:
        m = self.tree.match_prefix(MatchPrefixParams(key=RadixKey(key)))
        return m.device_prefix_len, m.last_device_node

    def lock(self, node: object) -> object:
        self.tree.inc_lock_ref(node)
        return node

    def unlock(self, node: object, lock: object) -> None:
        self.tree.dec_lock_ref(node)

    def prefix(self, node: object, length: int) -> torch.Tensor:
        return self.tree.path_device_indices(node)[:length]

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        need = align_up(num_tokens, self.page_size)
        short = need - self.allocator.available_size()
        if short > 0:
            self.tree.evict(EvictParams(num_tokens=short))
        slots: torch.Tensor | None = self.allocator.alloc(need)
        return slots

    def finish(self, key: array, slots: torch.Tensor, prefix_len: int) -> None:
        rkey = RadixKey(key).page_aligned(self.page_size)
        n = len(rkey)
        values = slots[:n].to(dtype=torch.int64, copy=True)
        inserted = self._insert(rkey, values, prefix_len)
        if inserted > prefix_len:
            self.allocator.free_segment(slots[prefix_len:inserted], start_pos=prefix_len)
        if n < len(key):  # the partial last page
            self.allocator.free_segment(slots[n:], start_pos=n)

    def _insert(self, key: RadixKey, values: torch.Tensor, prefix_len: int) -> int:
        """Insert; the prefix length whose duplicates the caller frees."""
        return int(self.tree.insert(InsertParams(key=key, value=values)).prefix_len)

    def size(self) -> int:
        """Slots the tree and the free list account for (a check)."""
        return int(
            self.tree.evictable_size()
            + self.tree.protected_size()
            + self.allocator.available_size()
        )


class UnifiedDriver(RadixDriver):
    """SGLang's ``UnifiedRadixCache`` on the TreeCore ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``
    names (rust): the tree frees the duplicates past ``prev_prefix_len``."""

    name = "sglang-unified-rust"

    @classmethod
    def build(cls, page_size: int, capacity: int) -> UnifiedDriver:
        params = _params(page_size, capacity)
        return cls(UnifiedRadixCache(params), params)

    def lock(self, node: object) -> object:
        tree = self.tree
        assert isinstance(tree, UnifiedRadixCache)
        return tree.lock(node)

    def unlock(self, node: object, lock: object) -> None:
        tree = self.tree
        assert isinstance(tree, UnifiedRadixCache)
        tree.unlock(lock)

    def _insert(self, key: RadixKey, values: torch.Tensor, prefix_len: int) -> int:
        self.tree.insert(InsertParams(key=key, value=values, prev_prefix_len=prefix_len))
        return prefix_len
