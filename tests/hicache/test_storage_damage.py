"""A damaged or failing store never takes the cache down and never serves wrong KV."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hicache.cache import HiRadixCache
from hicache.config.cache import CacheConfig
from hicache.factory import build_device_pool, build_host_pool
from storage_backends import StorageConfig
from tests.faulty_backends import RaisingBackend
from tests.hicache.helpers import serve, two_tier
from transfer import CpuTransferEngine

REPO = Path(__file__).resolve().parents[2]
SEQS = [[tag * 1000 + i for i in range(64)] for tag in range(1, 5)]

CHILD = """
import json, sys
from storage_backends import StorageConfig
from tests.faulty_backends import RaisingBackend
from tests.hicache.helpers import serve, two_tier
seqs = json.loads(sys.argv[1])
for path in sys.argv[2:]:
    cache = two_tier(page_size=16, pages=16, storage=StorageConfig(
        backend="lmdb", path=path, max_bytes=16 << 20))
    at_open = cache.storage.backend.stats().quarantined
    reused = [serve(cache, tokens) for tokens in seqs]  # KV checked bit for bit
    print(json.dumps(dict(at_open=at_open, reused=reused)), flush=True)
    cache.close()
"""


def _store(path: Path) -> HiRadixCache:
    return two_tier(
        page_size=16, pages=16, storage=StorageConfig("lmdb", str(path), max_bytes=16 << 20)
    )


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    root = tmp_path_factory.mktemp("cache-store") / "store"
    cache = _store(root)
    for tokens in SEQS:
        serve(cache, tokens)
    cache.close()
    return (root / "data.mdb").read_bytes()


def _damage(data: bytes, rng: random.Random) -> bytes:
    if rng.random() < 0.3:
        return data[: rng.randrange(len(data))]
    buf = bytearray(data)
    for _ in range(rng.choice([1, 4])):
        page = rng.randrange(len(buf) // 4096)
        offset = page * 4096 + (rng.randrange(64) if rng.random() < 0.6 else rng.randrange(4096))
        buf[offset] ^= 1 << rng.randrange(8)
    return bytes(buf)


def _check_cases(tmp_path: Path, data: bytes, seed: int, cases: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    paths = []
    for case in range(cases):
        path = tmp_path / f"case{case}"
        path.mkdir()
        (path / "data.mdb").write_bytes(_damage(data, rng))
        paths.append(path)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(SEQS), *map(str, paths)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-3000:]}"
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == cases
    for result, path in zip(results, paths, strict=True):
        moved = list(tmp_path.glob(f"{path.name}.damaged-*"))
        assert bool(moved) >= bool(result["at_open"])
        if result["at_open"]:
            assert result["reused"] == [0] * len(SEQS)  # quarantined on open: started empty
        shutil.rmtree(path)
        for m in moved:
            shutil.rmtree(m)
    return results


def test_cache_on_damaged_stores(tmp_path: Path, pristine: bytes) -> None:
    results = _check_cases(tmp_path, pristine, seed=11, cases=8)  # 60 more: make test-slow
    assert any(r["at_open"] for r in results)  # some stores were quarantined on open
    assert any(r["reused"] != [0] * len(SEQS) for r in results)  # some served intact pages


@pytest.mark.slow
def test_cache_on_many_more_damaged_stores(tmp_path: Path, pristine: bytes) -> None:
    _check_cases(tmp_path, pristine, seed=12, cases=60)


def test_backend_whose_every_method_raises_serves_misses() -> None:
    proto = two_tier(page_size=4, storage=StorageConfig(backend="memory", max_bytes=1 << 20))
    config: CacheConfig = proto.config
    proto.close()
    device = build_device_pool(config)
    host = build_host_pool(config, device)
    assert host is not None
    cache = HiRadixCache(config, device, host, CpuTransferEngine(device, host), RaisingBackend())
    tokens = SEQS[0][:16]
    assert serve(cache, tokens) == 0
    cache.drain()
    cache.evict(10**6)
    cache.evict_host(10**6)
    m = cache.match_prefix(tokens, with_storage=True)
    assert m.storage_hit_length == 0
    assert serve(cache, tokens) == 0
    cache.check_integrity()
    cache.close()
