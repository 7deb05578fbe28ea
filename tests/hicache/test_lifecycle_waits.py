"""Bounded waits on a stalled store, leaving without close(), failed constructors."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from hicache.cache import CacheError, HiRadixCache
from hicache.factory import build_device_pool, build_host_pool
from storage_backends import StorageConfig
from storage_backends.memory import MemoryBackend
from tests.hicache.helpers import serve, two_tier, write_kv
from transfer import CpuTransferEngine, FaultInjection

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 0.5


class Gate(MemoryBackend):
    """A memory store whose puts and gets wait for ``open`` (at most a minute)."""

    def __init__(self) -> None:
        super().__init__(StorageConfig(backend="memory", max_bytes=64 << 20))
        self.open = threading.Event()

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        self.open.wait(60)
        return super().put(keys, src)

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        self.open.wait(60)
        return super().get(keys, dst)


def _cache(backend: Gate, timeout_s: float = TIMEOUT_S, **kw: object) -> HiRadixCache:
    storage = StorageConfig(backend="memory", max_bytes=64 << 20, timeout_s=timeout_s)
    config = two_tier(storage=storage, **kw).config  # type: ignore[arg-type]
    device = build_device_pool(config)
    host = build_host_pool(config, device)
    assert host is not None
    return HiRadixCache(config, device, host, CpuTransferEngine(device, host), backend)


def test_drain_reset_close_return_while_the_store_stalls() -> None:
    gate = Gate()
    cache = _cache(gate)
    serve(cache, list(range(16)))  # its put now blocks in the backend (for a minute)
    cache.drain()  # returns after timeout_s
    assert not gate.open.is_set() and cache.stats().storage_wait_timeouts >= 1
    cache.check_integrity()
    with pytest.raises(CacheError, match="storage jobs still use host pages"):
        cache.reset()
    cache.check_integrity()
    cache.close()  # gives up on the stalled worker after timeout_s
    assert not gate.open.is_set()
    gate.open.set()  # the stalled worker finishes into a closed cache: nothing breaks


def test_the_late_put_lands_and_reset_then_works() -> None:
    gate = Gate()
    cache = _cache(gate)
    tokens = list(range(16))
    serve(cache, tokens)
    cache.drain()
    gate.open.set()
    cache.drain()  # the late completion is applied now
    cache.reset()
    cache.check_integrity()
    assert cache.match_prefix(tokens).device_hit_length == 0
    cache.close()


def test_wait_prefetch_gives_up_after_the_timeout() -> None:
    gate = Gate()
    gate.open.set()
    cache = _cache(gate, prefetch_policy="wait_complete")
    tokens = list(range(16))
    serve(cache, tokens)
    cache.drain()
    cache.evict(10**6)
    cache.evict_host(10**6)
    gate.open.clear()  # gets now stall
    m = cache.match_prefix(tokens)
    assert cache.prefetch("r", tokens, None, m.last_host_node) == 16
    status = cache.wait_prefetch("r")
    assert status.ready and not status.done and status.fetched_tokens == 0
    cache.release_prefetch("r")
    cache.check_integrity()
    gate.open.set()
    cache.drain()  # lands late; inserted as host-only nodes
    cache.check_integrity()
    assert cache.match_prefix(tokens).host_hit_length == 16
    cache.close()


def test_evict_all_after_drain_frees_every_unlocked_page() -> None:
    """Write-backs need host room that storage puts in flight still pin: evict
    waits for them instead of leaving pages a second drain-and-evict frees. A put
    stays in flight until the owner thread applies its completion, however fast
    the store is, so no slow store is needed for that."""
    gate = Gate()
    gate.open.set()
    cache = _cache(gate, timeout_s=60, pages=16, host_ratio=0.5, write_policy="write_back")
    shared = list(range(8))
    for tag in range(1, 5):  # a shared prefix node with four leaves below it
        serve(cache, [*shared, *(tag * 100 + i for i in range(8))])
    cache.drain()
    cache.evict(10**9)
    cache.check_integrity()
    assert cache.device_tokens() == 0
    cache.close()


def test_context_manager_closes() -> None:
    gate = Gate()
    gate.open.set()
    with _cache(gate) as cache:
        serve(cache, list(range(16)))
    assert cache.storage is None and cache.transfer is None
    cache.close()  # idempotent


LEAVE_WITHOUT_CLOSE = """
import sys
from storage_backends import StorageConfig
from tests.hicache.helpers import serve, two_tier
cache = two_tier(page_size=4, pages=64, storage=StorageConfig(
    backend="lmdb", path=sys.argv[1], max_bytes=64 << 20))
for t in range(20):
    serve(cache, [t * 1000 + i for i in range(48)])
print("served", flush=True)
# no close(): backups and storage writes are still in flight
"""

REOPEN = """
import sys
from storage_backends import StorageConfig
from tests.hicache.helpers import serve, two_tier
cache = two_tier(page_size=4, pages=64, storage=StorageConfig(
    backend="lmdb", path=sys.argv[1], max_bytes=64 << 20))
print(sum(serve(cache, [t * 1000 + i for i in range(48)]) for t in range(20)))
cache.close()
"""


@pytest.mark.parametrize(
    "attempt", [0, *(pytest.param(n, marks=pytest.mark.slow) for n in range(1, 6))]
)
def test_exit_without_close_exits_cleanly_and_the_store_reopens(
    tmp_path: Path, attempt: int
) -> None:
    """Before the fix this aborted (exit 134) about every other run."""
    store = str(tmp_path / "store")
    run = [sys.executable, "-c", LEAVE_WITHOUT_CLOSE, store]
    done = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr
    again = subprocess.run(
        [sys.executable, "-c", REOPEN, store], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert not list(tmp_path.glob("store.damaged-*"))
    assert int(again.stdout.split()[-1]) > 0  # pages written before the exit are served


FAILED_CONSTRUCTIONS = """
import gc, os, threading
from storage_backends import StorageConfig
from tests.hicache.helpers import two_tier
bad = StorageConfig(backend="lmdb", path="/nonexistent-parent/store")

def fail_once():
    try:  # device and host pools of 64k tokens
        two_tier(page_size=16, pages=4096, storage=bad)
    except Exception as exc:
        assert "parent directory" in str(exc), exc
    else:
        raise SystemExit("constructed on an unusable path")

def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20

fail_once()  # imports, allocator caches
gc.collect()
threads, rss = threading.active_count(), rss_mib()
for _ in range(10):
    fail_once()
gc.collect()
print(threads, threading.active_count(), rss_mib() - rss)
"""


def test_ten_failed_constructions_leave_no_threads() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FAILED_CONSTRUCTIONS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, after, grown_mib = map(int, done.stdout.split())
    assert after == before
    assert grown_mib < 130  # held until a GC cycle, ten failures grew it by ~260 MiB


def test_drain_is_bounded_while_a_copy_stalls() -> None:
    slow = FaultInjection(delay_s=60.0)  # per layer; close() cuts it short
    cache = two_tier(faults=slow, storage=StorageConfig(backend="none", timeout_s=TIMEOUT_S))
    tokens = list(range(16))
    m = cache.match_prefix(tokens)
    cache.inc_lock_ref(m.last_device_node)
    new = cache.alloc_device(16)
    assert new is not None
    write_kv(cache, tokens, 0, new)
    cache.cache_finished_req(tokens, new, m.last_device_node)  # write-through backup starts
    cache.drain()  # returns although the copy needs two minutes
    cache.check_integrity()
    assert cache.protected_size() == 16  # the backup in flight still holds its node
    with pytest.raises(CacheError):
        cache.reset()  # nothing dropped under a copy in flight
    cache.check_integrity()
    cache.close()
