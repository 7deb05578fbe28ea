"""The ``cost`` prefetch policy in the cache, on a fake clock over a throttled store.

The store is a memory store behind ``ThrottledBackend`` whose reads advance
the fake clock by their bytes over its bandwidth, so every measured rate,
deadline and budget is exact; ``Gate`` stalls one read until the test opens
it. Prefetches are read in pieces of two pages (``PIECE_BYTES`` set small).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest
import torch

import hicache.tiers.storage as storage_tier
from hicache.bench.engine.throttle import ThrottledBackend
from hicache.cache import HiRadixCache
from hicache.config.cache import CacheConfig, DeviceConfig, HostConfig, ModelConfig, PolicyConfig
from storage_backends import StorageConfig
from storage_backends.memory import MemoryBackend
from tests.hicache.fake_clock import FakeClock
from tests.hicache.helpers import check_kv, write_kv

PS = 4  # tokens a page
PREFILL = 10_000.0  # tokens/s, reported as the engine would
KB = 1000


class Gate(ThrottledBackend):
    """A throttled store whose ``stall_at``-th get (counting from 1) waits
    until ``opened``; ``stalled`` is set when it starts waiting."""

    def __init__(self, inner: MemoryBackend, bytes_per_s: float, clock: FakeClock) -> None:
        super().__init__(inner, bytes_per_s, sleep=clock.advance, clock=clock)
        self.gets = self.lookups = 0
        self.stall_at = 0
        self.stalled = threading.Event()
        self.opened = threading.Event()

    def exists(self, keys: Sequence[bytes]) -> int:
        self.lookups += 1
        return super().exists(keys)

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        self.gets += 1
        if self.gets == self.stall_at:
            self.stalled.set()
            self.opened.wait(10)
        return super().get(keys, dst)


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_tier, "PIECE_BYTES", 1)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def build(clock: FakeClock, bytes_per_s: float, policy: str = "cost") -> HiRadixCache:
    cfg = CacheConfig(
        model=ModelConfig(num_layers=2, kv_heads=2, head_dim=4, dtype="float32"),
        device=DeviceConfig(device="cpu", page_size=PS, num_tokens=256 * PS),
        host=HostConfig(enabled=True, ratio=2.0, reserve_gb=0.0),
        policy=PolicyConfig(
            load_back_threshold=1,
            prefetch_threshold=1,
            prefetch_policy=policy,
            io_workers=1,
            prefill_tokens_per_s=PREFILL,
        ),
        storage=StorageConfig(backend="memory", max_bytes=8 << 20, timeout_s=2.0),
    )
    store = Gate(MemoryBackend(cfg.storage), bytes_per_s, clock)
    return HiRadixCache(cfg, storage=store, clock=clock)


@pytest.fixture
def caches(clock: FakeClock) -> Iterator[list[HiRadixCache]]:
    made: list[HiRadixCache] = []
    yield made
    for cache in made:
        gate(cache).opened.set()
        cache.drain()
        cache.check_integrity()
        cache.close()


def gate(cache: HiRadixCache) -> Gate:
    assert cache.storage is not None
    inner = cache.storage.backend._backend  # the guard's backend: ours
    assert isinstance(inner, Gate)
    return inner


def prompt(seed: int, n: int = 64) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1000, (n,), generator=g).tolist()


def compute(cache: HiRadixCache, toks: list[int]) -> None:
    """A request that computes what the cache lacks, then finishes."""
    adm = cache.admit(cache.match_prefix(toks))
    check_kv(cache, toks, adm.device_indices)
    have = adm.device_indices.numel()
    new = cache.alloc_device(len(toks) - have)
    assert new is not None
    write_kv(cache, toks, have, new)
    cache.cache_finished_req(toks, torch.cat([adm.device_indices, new]), adm.last_node)
    cache.check_integrity()


def push_to_storage(cache: HiRadixCache) -> None:
    cache.drain()
    cache.evict(10**9)
    cache.evict_host(10**9)
    cache.check_integrity()


def stored(cache: HiRadixCache, seed: int, n: int = 64) -> list[int]:
    toks = prompt(seed, n)
    compute(cache, toks)
    push_to_storage(cache)
    return toks


def fetch(cache: HiRadixCache, rid: str, toks: list[int]) -> int:
    """Prefetch ``toks`` and wait for it to land; tokens fetched (0 also when
    the policy judged none worth reading and started no read)."""
    if not cache.prefetch(rid, toks, None, cache.match_prefix(toks).last_host_node):
        return 0
    status = cache.wait_prefetch(rid)
    assert status.done
    cache.release_prefetch(rid)
    cache.check_integrity()
    return status.fetched_tokens


def warm(cache: HiRadixCache, seed: int = 99) -> None:
    """One read measures the store (cold start loads everything); one forward
    pass reports the prefill speed."""
    toks = stored(cache, seed)
    assert fetch(cache, "warm", toks) == len(toks)
    cache.record_prefill(64, 64 / PREFILL)
    s2h = cache.rates().s2h
    assert s2h is not None
    assert s2h.bytes_per_s == pytest.approx(gate(cache).bytes_per_s, rel=1e-6)


def serve(cache: HiRadixCache, toks: list[int]) -> int:
    """Admit ``toks`` (loading what the policy says), check the reused KV bit
    for bit, compute the rest; tokens reused."""
    adm = cache.admit(cache.match_prefix(toks))
    cache.start_loading()
    check_kv(cache, toks, adm.device_indices)
    reused = adm.device_indices.numel()
    cache.dec_lock_ref(adm.last_node)
    compute(cache, toks)
    return reused


BYTES_PER_TOKEN = 2 * 2 * 2 * 4 * 4  # layers, K and V, heads, dim, float32
# 64 tokens recompute in 6.4 ms; their 8 KiB read breaks even at 1.28 MB/s.


def test_a_fast_store_is_read_in_full(clock: FakeClock, caches: list[HiRadixCache]) -> None:
    cache = build(clock, 100_000 * KB)
    caches.append(cache)
    warm(cache)
    toks = stored(cache, 1)
    assert fetch(cache, "r", toks) == 64
    assert serve(cache, toks) == 64
    stats = cache.stats()
    assert stats.prefetch_complete == 2 and stats.prefetch_declined == 0


def test_a_hopeless_store_is_not_read_at_all(clock: FakeClock, caches: list[HiRadixCache]) -> None:
    cache = build(clock, 10 * KB)  # a 64-token read: 0.8 s against 6.4 ms of compute
    caches.append(cache)
    warm(cache)
    toks = stored(cache, 2)
    gets, lookups = gate(cache).gets, gate(cache).lookups
    assert fetch(cache, "r", toks) == 0
    assert (gate(cache).gets, gate(cache).lookups) == (gets, lookups)  # not even looked up
    assert serve(cache, toks) == 0
    stats = cache.stats()
    assert stats.prefetch_declined == 1 and stats.prefetch_started == 2  # (and the warm-up's)


def test_in_between_the_host_part_is_loaded_and_storage_recomputed(
    clock: FakeClock, caches: list[HiRadixCache]
) -> None:
    """A host hit (a fast copy) and a storage hit just slower than prefill."""
    cache = build(clock, 1000 * KB)  # 8 KiB in 8.2 ms, 6.4 ms to recompute
    caches.append(cache)
    warm(cache)
    toks = prompt(3, 96)
    compute(cache, toks[:32])  # the first 32 tokens stay on host
    compute(cache, toks)
    cache.drain()
    cache.evict(10**9)  # device -> host for all 96
    m = cache.match_prefix(toks)
    assert m.host_hit_length == 96
    cache.evict_host(10**9)
    compute(cache, toks[:32])
    cache.drain()
    cache.evict(10**9)
    m = cache.match_prefix(toks)
    assert (m.device_hit_length, m.host_hit_length) == (0, 32)
    assert fetch(cache, "r", toks) == 0  # storage's 64: recomputed
    assert serve(cache, toks) == 32  # host's 32: loaded
    assert cache.stats().prefetch_declined == 1


def test_a_stalled_read_is_cut_at_its_deadline_and_what_arrived_is_used(
    clock: FakeClock, caches: list[HiRadixCache]
) -> None:
    cache = build(clock, 10_000 * KB)
    caches.append(cache)
    warm(cache)
    toks = stored(cache, 4)  # 16 pages: 8 pieces of 2
    store = gate(cache)
    store.stall_at = store.gets + 3  # pieces 1 and 2 land, piece 3 stalls
    assert cache.prefetch("r", toks, None, cache.match_prefix(toks).last_host_node) == 64
    assert store.stalled.wait(5)
    first = cache.check_prefetch("r")
    assert not first.ready and not first.done and first.fetched_tokens == 16
    cache.check_integrity()
    assert 0 < first.wait_s < 0.01  # the expected 0.8 ms read, with slack
    clock.advance(first.wait_s / 2)
    assert not cache.check_prefetch("r").ready
    clock.advance(first.wait_s)
    status = cache.check_prefetch("r")
    assert status.ready and not status.done and status.fetched_tokens == 16
    cache.release_prefetch("r")  # the request goes on: 16 tokens are the tree's now
    cache.check_integrity()
    assert cache.stats().prefetch_cuts == 1
    m = cache.match_prefix(toks)
    assert (m.device_hit_length, m.host_hit_length) == (0, 16)
    assert serve(cache, toks) == 16  # bit for bit (serve checks the KV)
    store.opened.set()  # the stalled piece lands late; nothing after it is read
    cache.drain()
    cache.check_integrity()
    assert store.gets == store.stall_at
    assert cache.host_reserved_size() == 0
    s2h = cache.rates().s2h
    assert s2h is not None and s2h.bytes_per_s < 10_000 * KB  # the stall counted


def test_without_a_measurement_cost_waits_as_timeout_does(
    clock: FakeClock, caches: list[HiRadixCache]
) -> None:
    for policy in ("timeout", "cost"):
        cache = build(clock, 10_000 * KB, policy)
        caches.append(cache)
        toks = stored(cache, 5)
        store = gate(cache)
        store.stall_at = store.gets + 1
        assert cache.prefetch("r", toks, None, cache.match_prefix(toks).last_host_node)
        assert store.stalled.wait(5)
        budget = 1.0 + 0.25 * 64 / 1000  # prefetch_timeout_base_s + per_1k_s
        status = cache.check_prefetch("r")
        assert not status.ready and status.wait_s == pytest.approx(budget)
        clock.advance(budget - 1e-3)
        assert not cache.check_prefetch("r").ready
        clock.advance(2e-3)
        assert cache.check_prefetch("r").ready
        cache.release_prefetch("r")
        store.opened.set()
        cache.drain()
        cache.check_integrity()


@pytest.mark.parametrize(("before", "after"), [(50_000 * KB, 200 * KB), (200 * KB, 50_000 * KB)])
def test_the_estimate_follows_a_store_that_slows_down_or_speeds_up(
    clock: FakeClock, caches: list[HiRadixCache], before: float, after: float
) -> None:
    cache = build(clock, before, "wait_complete")  # reads everything: every read measures
    caches.append(cache)
    for i in range(3):
        fetch(cache, f"a{i}", stored(cache, 10 + i))
    s2h = cache.rates().s2h
    assert s2h is not None and s2h.bytes_per_s == pytest.approx(before, rel=0.01)
    gate(cache).set_rate(after)
    for i in range(12):  # 0.7**12: within 8% of a 250-fold change
        fetch(cache, f"b{i}", stored(cache, 20 + i))
    s2h = cache.rates().s2h
    assert s2h is not None and s2h.bytes_per_s == pytest.approx(after, rel=0.1)


def test_a_store_that_speeds_up_is_read_again_after_a_probe(
    clock: FakeClock, caches: list[HiRadixCache]
) -> None:
    cache = build(clock, 10 * KB)
    caches.append(cache)
    warm(cache)
    assert fetch(cache, "slow", stored(cache, 30)) == 0
    gate(cache).set_rate(100_000 * KB)
    assert fetch(cache, "still", stored(cache, 31)) == 0  # measured recently: not read
    clock.advance(31.0)  # policy.cost_probe_s (30 s) without a measurement
    assert fetch(cache, "probe", stored(cache, 32)) == PS  # 1/16 of 64 tokens, one page
    assert fetch(cache, "fast", stored(cache, 33)) == 64
