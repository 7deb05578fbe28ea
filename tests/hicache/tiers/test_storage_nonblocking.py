"""No storage backend call runs on the owner thread: a backend that blocks
every call until released never stalls match, prefetch, check or poll."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from hicache.cache import HiRadixCache
from hicache.factory import build_device_pool, build_host_pool
from storage_backends import StorageConfig, StorageStats, create
from tests.hicache.helpers import serve, two_tier
from transfer import CpuTransferEngine

GATE_LIMIT_S = 60.0  # a call still blocked after this means the owner waited for it


class GatedBackend:
    """A real memory backend behind a gate: while the gate is closed every call
    blocks in the calling thread; ``owner_blocked`` records a call made from
    the owner thread while closed (it would have stalled the scheduler)."""

    def __init__(self, owner: threading.Thread) -> None:
        self._inner = create("memory", StorageConfig(backend="memory", max_bytes=64 << 20))
        self._owner = owner
        self.gate = threading.Event()
        self.gate.set()
        self.owner_blocked: list[str] = []
        self.entered = threading.Event()  # a call is blocked at the gate

    def _pass(self, name: str) -> None:
        if self.gate.is_set():
            return
        if threading.current_thread() is self._owner:
            self.owner_blocked.append(name)
        self.entered.set()
        self.gate.wait(GATE_LIMIT_S)

    def exists(self, keys: Sequence[bytes]) -> int:
        self._pass("exists")
        return self._inner.exists(keys)

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        self._pass("get")
        return self._inner.get(keys, dst)

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        self._pass("put")
        return self._inner.put(keys, src)

    def delete(self, keys: Sequence[bytes]) -> int:
        self._pass("delete")
        return self._inner.delete(keys)

    def take_removed(self) -> list[bytes]:
        self._pass("take_removed")
        return self._inner.take_removed()

    def stats(self) -> StorageStats:
        return self._inner.stats()

    def close(self) -> None:
        self._inner.close()


def gated_cache(backend: GatedBackend) -> HiRadixCache:
    template = two_tier(page_size=4, prefetch_policy="best_effort")
    template.close()
    cfg = template.config
    device = build_device_pool(cfg)
    host = build_host_pool(cfg, device)
    assert host is not None
    return HiRadixCache(cfg, device, host, CpuTransferEngine(device, host), storage=backend)


def test_blocked_backend_never_stalls_the_owner_thread() -> None:
    backend = GatedBackend(threading.current_thread())
    cache = gated_cache(backend)
    a = [1000 + i for i in range(16)]
    serve(cache, a)  # gate open: the pages reach storage
    cache.drain()
    cache.evict(10**9)
    cache.evict_host(10**9)
    cache.check_integrity()

    backend.gate.clear()
    m = cache.match_prefix(a, with_storage=True)
    assert (m.device_hit_length, m.host_hit_length, m.storage_hit_length) == (0, 0, 0)
    assert cache.prefetch("r", a, None, m.last_host_node) == 16
    status = cache.check_prefetch("r")
    assert status.ready and not status.done  # best_effort: go on without it
    cache.poll()
    cache.check_integrity()
    assert backend.owner_blocked == []
    assert backend.entered.wait(GATE_LIMIT_S)  # a worker is stuck in the backend meanwhile
    assert not cache.check_prefetch("r").done

    backend.gate.set()
    cache.drain()
    status = cache.check_prefetch("r")
    assert status.done and status.fetched_tokens == 16
    cache.release_prefetch("r")
    assert cache.match_prefix(a).host_hit_length == 16
    assert serve(cache, a) == 16  # loaded back and checked bit for bit
    assert backend.owner_blocked == []
    cache.close()
