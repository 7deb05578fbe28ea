"""Every public method of SGLang's ``HiCacheStorage`` at the pinned release is either
implemented by ``HicacheStorage`` or inherited on purpose (listed below with why), so
that a release bump that adds a method fails here and shows what is new."""

from __future__ import annotations

import inspect

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from hicache.integrations.sglang import HicacheStorage

# Inherited on purpose: name -> why the base class's behaviour is right for us.
INHERITED = {
    "register_mem_host_pool_v2": "hybrid pools (v2) are not supported: the base only records "
    "the pool, and the v2 calls answer misses",
    "on_host_pools_registered": "nothing to finalize once the pools are known: the namespace "
    "is fixed by register_mem_pool_host",
}


def public_methods(cls: type) -> set[str]:
    return {n for n, v in inspect.getmembers(cls) if not n.startswith("_") and callable(v)}


def test_every_base_method_is_implemented_or_inherited_on_purpose() -> None:
    ours = {n for n in public_methods(HiCacheStorage) if n in HicacheStorage.__dict__}
    unaccounted = public_methods(HiCacheStorage) - ours - set(INHERITED)
    assert not unaccounted, f"new in SGLang's HiCacheStorage: implement or list {unaccounted}"
    assert not set(INHERITED) & ours, "listed as inherited but implemented"
    assert set(INHERITED) <= public_methods(HiCacheStorage), "listed but gone from the base"
