"""The reference engine's output stays bit-exact whatever the prefetch policy
decides: over a store throttled far below and far above the model's prefill
speed (so that ``cost`` reads all of a hit, or none of it), and over a store
whose read stalls half-way (cut at its deadline: the pages that arrived are
reused, the rest recomputed)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence

import pytest

import hicache.tiers.storage as storage_tier
from hicache.bench.engine.throttle import ThrottledBackend
from hicache.cache import HiRadixCache
from hicache.engine import Engine, EngineOptions, RequestOutput, TinyLlama
from hicache.policies.prefetch import PREFETCH_POLICIES
from storage_backends.memory import MemoryBackend
from tests.hicache.engine.helpers import (
    SPEC,
    assert_clean,
    assert_same,
    chat,
    config,
    push_to_storage,
    reference,
    tokens,
)


class StallingStore(ThrottledBackend):
    """The ``stall_at``-th get waits until ``released``."""

    def __init__(self, inner: MemoryBackend, bytes_per_s: float) -> None:
        super().__init__(inner, bytes_per_s)
        self.stall_at = 0
        self.gets = 0
        self.released = threading.Event()

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        self.gets += 1
        if self.gets == self.stall_at:
            self.released.wait(30)
        return super().get(keys, dst)


def turns() -> list[list[int]]:
    rng = random.Random(44)
    return [tokens(rng, n) for n in (90, 40, 50, 30)]


def run(
    policy: str, store: ThrottledBackend, between: Callable[[HiRadixCache], None] = push_to_storage
) -> tuple[list[RequestOutput], HiRadixCache]:
    cfg = config(16, 2048, store=None, prefetch_policy=policy)
    cfg = cfg.__class__(
        model=cfg.model,
        device=cfg.device,
        host=cfg.host.__class__(enabled=True, ratio=4.0, reserve_gb=0.0),
        policy=cfg.policy,
        storage=cfg.storage.__class__(backend="memory", max_bytes=64 << 20, timeout_s=5.0),
    )
    cache = HiRadixCache(cfg, storage=store)
    eng = Engine(TinyLlama(SPEC, cache.device_pool.device), cache, EngineOptions(chunk_size=64))
    return chat(eng, turns(), between=between), cache


@pytest.mark.parametrize("policy", sorted(PREFETCH_POLICIES))
@pytest.mark.parametrize("rate", [pytest.param(2e5, id="slow"), pytest.param(1e10, id="fast")])
def test_every_policy_at_every_speed_matches_a_full_recompute(policy: str, rate: float) -> None:
    want = chat(reference(), turns())
    store = ThrottledBackend(MemoryBackend(config(16, 64).storage.__class__()), rate)
    got, cache = run(policy, store)
    assert_same(got, want)
    stats = cache.stats()
    if policy == "cost" and rate < 1e6:  # 25 kB of KV a turn: 0.1 s against a few ms
        assert stats.prefetch_declined >= 2 and sum(o.hits.storage for o in got[2:]) == 0
    if policy in ("wait_complete", "timeout") or (policy == "cost" and rate > 1e6):
        assert all(o.hits.storage > 0 for o in got[1:])
    assert_clean(cache)
    cache.close()


def test_a_stalled_read_is_cut_and_the_output_stays_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_tier, "PIECE_BYTES", 1)  # 8 pieces a read
    want = chat(reference(), turns())
    store = StallingStore(MemoryBackend(config(16, 64).storage.__class__()), 1e10)
    # Turn 1 reads 5 pages (cold start: everything, measured), turn 2 reads 8
    # pages, a piece each: its second piece (get 7) stalls until the turn is over.
    store.stall_at = 7

    def between(cache: HiRadixCache) -> None:
        if store.gets >= store.stall_at:  # the stalled turn is over: let the piece land
            store.released.set()
        push_to_storage(cache)

    try:
        got, cache = run("cost", store, between)
    finally:
        store.released.set()
    assert_same(got, want)
    assert cache.stats().prefetch_cuts == 1
    # What arrived before the deadline (a few ms: how much depends on the machine's
    # load) is reused, the rest recomputed; tests/hicache/test_cost_prefetch.py
    # checks the pages that arrived on a fake clock.
    assert got[2].hits.storage < 128
    assert_clean(cache)
    cache.close()
