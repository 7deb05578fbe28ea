from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

from hicache.cache import CacheError, HiRadixCache
from hicache.policies.prefetch import PREFETCH_POLICIES
from hicache.tiers.results import MatchResult
from storage_backends import StorageConfig
from tests.hicache.helpers import serve, two_tier

REPO = Path(__file__).resolve().parents[3]


def seq(tag: int, n: int) -> list[int]:
    return [tag * 1000 + i for i in range(n)]


def tiered(tmp_path: Path, backend: str = "lmdb", **kw: object) -> HiRadixCache:
    cfg = StorageConfig(backend=backend, path=str(tmp_path / "store"), max_bytes=64 << 20)
    return two_tier(storage=cfg, **kw)  # type: ignore[arg-type]


def storage_match(cache: HiRadixCache, tokens: list[int]) -> MatchResult:
    """``match_prefix(with_storage=True)`` once the lookup it starts has
    completed on the storage workers (the match itself never waits for it)."""
    first = cache.match_prefix(tokens, with_storage=True)
    assert first.storage_hit_length == 0  # nothing looked up yet
    cache.drain()
    return cache.match_prefix(tokens, with_storage=True)


def push_out(cache: HiRadixCache) -> None:
    """Drop everything from device and host (storage keeps it)."""
    cache.drain()
    cache.evict(10**9)
    cache.evict_host(10**9)
    cache.check_integrity()


@pytest.mark.parametrize("backend", ["lmdb", "file", "memory"])
@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_all_tiers_round_trip_bit_identical(tmp_path: Path, backend: str, layout: str) -> None:
    cache = tiered(tmp_path, backend, page_size=4, layout=layout)
    a = seq(1, 16)
    serve(cache, a)
    push_out(cache)
    m = storage_match(cache, a)
    assert (m.device_hit_length, m.host_hit_length, m.storage_hit_length) == (0, 0, 16)
    assert serve(cache, a) == 16  # prefetched, loaded back, checked bit for bit
    cache.close()


def test_prefetch_extends_a_host_match(tmp_path: Path) -> None:
    cache = tiered(tmp_path, page_size=4)
    a = seq(1, 16)
    serve(cache, a)
    cache.drain()
    cache.evict(8)  # deepest 8 tokens to host
    cache.evict_host(4)  # ... and the last page out of host too
    m = storage_match(cache, a)
    assert m.device_hit_length + m.host_hit_length == 8 or m.host_hit_length < 8
    assert m.storage_hit_length == 16 - m.device_hit_length - m.host_hit_length
    assert serve(cache, [*a, *seq(2, 4)]) == 16
    cache.close()


def test_prefetch_threshold_and_unknown_request(tmp_path: Path) -> None:
    cache = tiered(tmp_path, page_size=4, prefetch_threshold=32)
    a = seq(1, 16)
    serve(cache, a)
    push_out(cache)
    assert cache.prefetch("r", a, None, cache.match_prefix(a).last_host_node) == 0
    with pytest.raises(CacheError):
        cache.check_prefetch("r")
    cache.close()


@pytest.mark.parametrize("policy", sorted(PREFETCH_POLICIES))
def test_prefetch_policies(tmp_path: Path, policy: str) -> None:
    cache = tiered(tmp_path, page_size=4, prefetch_policy=policy)
    a = seq(1, 16)
    serve(cache, a)
    push_out(cache)
    assert cache.prefetch("r", a, None, cache.match_prefix(a).last_host_node) == 16
    with pytest.raises(CacheError):
        cache.prefetch("r", a, None, cache.tree.root)
    status = cache.check_prefetch("r")
    if policy == "best_effort":
        assert status.ready
    if not status.done:
        assert policy != "wait_complete" or not status.ready
    cache.drain()
    status = cache.check_prefetch("r")
    assert status.done and status.ready and status.fetched_tokens == 16
    cache.release_prefetch("r")
    assert cache.match_prefix(a).host_hit_length == 16
    cache.check_integrity()
    cache.close()


def test_corrupt_page_is_a_miss_and_never_loaded(tmp_path: Path) -> None:
    cache = tiered(tmp_path, page_size=4)
    a = seq(1, 16)
    serve(cache, a)
    push_out(cache)
    third_page = cache_keys(cache, a)[2]
    cache.close()
    env = lmdb.open(str(tmp_path / "store"), max_dbs=8, subdir=True)
    with env.begin(write=True) as txn:
        for name in (b"pages", None):
            db = env.open_db(name, txn=txn) if name else None
            raw = txn.get(third_page, db=db)
            if raw is not None:
                flipped = bytearray(raw)
                flipped[-1] ^= 0xFF
                txn.put(third_page, bytes(flipped), db=db)
                break
        else:
            pytest.fail("page not found in the LMDB store")
    env.close()
    fresh = tiered(tmp_path, page_size=4)
    m = storage_match(fresh, a)
    assert m.storage_hit_length == 16  # exists() does not read payloads
    assert serve(fresh, a) == 8  # two good pages, then the corrupt one stops the prefix
    fresh.close()


def cache_keys(cache: HiRadixCache, tokens: list[int]) -> list[bytes]:
    from hicache.keys.hashing import page_keys

    return page_keys(cache.fingerprint, None, tokens, cache.page_size)


WRITER = """
import sys
from tests.hicache.helpers import serve, two_tier
from storage_backends import StorageConfig
cfg = StorageConfig(backend="lmdb", path=sys.argv[1], max_bytes=64 << 20)
cache = two_tier(page_size=4, storage=cfg)
serve(cache, [1000 + i for i in range(24)])
cache.close()
"""


def test_warm_restart_across_processes(tmp_path: Path) -> None:
    store = tmp_path / "store"
    subprocess.run([sys.executable, "-c", WRITER, str(store)], cwd=REPO, check=True)
    cache = tiered(tmp_path, page_size=4)
    a = seq(1, 24)
    m = storage_match(cache, a)
    assert m.device_hit_length == 0 and m.storage_hit_length == 24
    assert serve(cache, a) == 24  # the previous process's KV, bit for bit
    cache.close()


def test_storage_needs_host_tier() -> None:
    from hicache.config.cache import CacheConfig

    with pytest.raises(ValueError, match="host"):
        CacheConfig.from_mapping({"host": {"enabled": False}, "storage": {"backend": "memory"}})
