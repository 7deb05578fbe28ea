"""Slow, reordered and failing host transfers never change a single output bit."""

from __future__ import annotations

import random

import pytest

from hicache.cache import HiRadixCache
from hicache.engine import Engine, EngineOptions, TinyLlama
from hicache.factory import build_device_pool, build_host_pool
from tests.hicache.engine.helpers import (
    SPEC,
    assert_clean,
    assert_same,
    chat,
    config,
    push_to_host,
    reference,
    tokens,
)
from transfer import CpuTransferEngine, FaultInjection


def faulty_engine(page_size: int, faults: FaultInjection) -> Engine:
    cfg = config(page_size, 1024, host=True)
    device = build_device_pool(cfg)
    host = build_host_pool(cfg, device)
    assert host is not None
    cache = HiRadixCache(cfg, device, host, CpuTransferEngine(device, host, faults=faults))
    return Engine(TinyLlama(SPEC), cache, EngineOptions(chunk_size=32))


def turns(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [tokens(rng, n) for n in (40, 17, 23, 30)]


@pytest.mark.parametrize("page_size", [1, 16])
def test_slow_reordered_loads_are_waited_for(page_size: int) -> None:
    user = turns(1)
    want = chat(reference(), user)
    faults = FaultInjection(delay_s=0.002, jitter_s=0.002, reorder=True, seed=page_size)
    eng = faulty_engine(page_size, faults)
    got = chat(eng, user, between=push_to_host)
    assert_same(got, want)
    assert all(out.hits.host > 0 for out in got[1:])
    assert_clean(eng.cache)
    eng.cache.close()


@pytest.mark.parametrize("page_size", [1, 16])
def test_failed_transfers_fall_back_to_recompute(page_size: int) -> None:
    # Every second copy fails: some backups (no host copy), some load-backs
    # (the forward pass stops at wait_layer; the batch is retracted and recomputed).
    user = turns(2)
    want = chat(reference(), user)
    eng = faulty_engine(page_size, FaultInjection(fail_every=2, delay_s=0.001))
    got = chat(eng, user, between=push_to_host)
    assert_same(got, want)
    assert sum(out.retractions for out in got) > 0
    assert_clean(eng.cache)
    eng.cache.close()
