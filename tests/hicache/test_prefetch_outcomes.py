"""Every finished prefetch counts exactly one outcome, and only a fault counts
as ``failed``: a fresh store (nothing to fetch) must not alarm an operator."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from hicache.cache import HiRadixCache
from hicache.factory import build_device_pool, build_host_pool
from hicache.observe.metrics import PREFETCH_OUTCOMES, CacheStats
from storage_backends import StorageConfig, StorageStats
from storage_backends.memory import MemoryBackend
from tests.hicache.helpers import serve, two_tier
from transfer import CpuTransferEngine

FINAL = [o for o in PREFETCH_OUTCOMES if o != "started"]


def outcomes(stats: CacheStats) -> dict[str, int]:
    counts = {o: getattr(stats, f"prefetch_{o}") for o in FINAL}
    assert stats.prefetch_started == sum(counts.values()), "an outcome was lost or doubled"
    return {o: n for o, n in counts.items() if n}


def lmdb_cache(tmp_path: Path, prefetch_threshold: int = 1) -> HiRadixCache:
    store = StorageConfig(backend="lmdb", path=str(tmp_path / "store"), max_bytes=64 << 20)
    return two_tier(4, pages=16, storage=store, prefetch_threshold=prefetch_threshold)


def test_a_fresh_store_counts_misses_not_failures(tmp_path: Path) -> None:
    cache = lmdb_cache(tmp_path)
    for base in (1000, 2000, 3000):
        serve(cache, [base + i for i in range(16)])
    cache.drain()
    assert outcomes(cache.stats()) == {"miss": 3}
    cache.close()


def test_pages_back_from_storage_are_complete_or_partial(tmp_path: Path) -> None:
    cache = lmdb_cache(tmp_path)
    a = [7000 + i for i in range(16)]
    serve(cache, a)
    cache.drain()
    cache.evict(10**9)
    cache.evict_host(10**9)
    serve(cache, a)  # all 4 pages from storage
    cache.drain()
    cache.evict(10**9)
    cache.evict_host(10**9)
    serve(cache, a + [8000 + i for i in range(8)])  # 4 of 6 pages from storage
    cache.drain()
    assert outcomes(cache.stats()) == {"miss": 1, "complete": 1, "partial": 1}
    cache.close()


def test_too_few_pages_in_storage_is_below_threshold(tmp_path: Path) -> None:
    cache = lmdb_cache(tmp_path, prefetch_threshold=8)
    a = [500 + i for i in range(4)]  # one page: 4 tokens, under the threshold of 8
    serve(cache, a)
    cache.drain()
    cache.evict(10**9)
    cache.evict_host(10**9)
    serve(cache, a + [900 + i for i in range(12)])
    cache.drain()
    assert outcomes(cache.stats()) == {"below_threshold": 1}  # a 4-token prompt is not prefetched
    cache.close()


class UnreadableBackend(MemoryBackend):
    """Lists every page as present but cannot read any (a store gone bad)."""

    def exists(self, keys: Sequence[bytes]) -> int:
        return len(keys)

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        return [False] * len(keys)


def test_listed_pages_that_cannot_be_read_are_failed() -> None:
    base = two_tier(4, pages=16)
    cfg = replace(base.config, storage=StorageConfig(backend="memory", max_bytes=1 << 20))
    base.close()
    device = build_device_pool(cfg)
    host = build_host_pool(cfg, device)
    assert host is not None
    backend = UnreadableBackend(cfg.storage)
    cache = HiRadixCache(cfg, device, host, CpuTransferEngine(device, host), backend)
    serve(cache, [3 + i for i in range(16)])
    cache.drain()
    assert outcomes(cache.stats()) == {"failed": 1}
    assert isinstance(backend.stats(), StorageStats)
    cache.close()
