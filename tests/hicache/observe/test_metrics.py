from __future__ import annotations

import math

import pytest

from hicache.observe.metrics import LATENCIES, LATENCY_BUCKETS, CacheMetrics, CacheStats
from tests.hicache.helpers import serve, two_tier


def seq(tag: int, n: int) -> list[int]:
    return [tag * 1000 + i for i in range(n)]


def test_stats_count_lookups_hits_per_tier_and_bytes() -> None:
    cache = two_tier(4, pages=16)
    a = seq(1, 16)
    serve(cache, a[:8])
    serve(cache, a)  # two nodes: 8 + 8 tokens
    cache.drain()
    cache.evict(8)  # the leaf goes to host
    serve(cache, a)
    cache.drain()
    stats = cache.stats()
    assert isinstance(stats, CacheStats)
    assert stats.hit_tokens_device == 16 and stats.hit_tokens_host == 8  # 8 + 8 on device
    assert stats.lookup_tokens == 8 + 16 + 16
    assert stats.miss_tokens == stats.lookup_tokens - 24
    assert stats.bytes_d2h > 0 and stats.bytes_h2d > 0
    assert stats.demoted_tokens_device == 8
    assert stats.as_dict()["requests"] == 3
    cache.close()


def test_latency_histograms_bucket_each_observation() -> None:
    metrics = CacheMetrics()
    for seconds in (0.0, 0.0001, 0.0003, 2.0, 60.0):
        metrics.observe_latency("load_back", seconds)
    metrics.observe_latency("storage_get", 0.004)
    hists = metrics.histograms()
    assert set(hists) == set(LATENCIES)
    h = hists["load_back"]
    assert h.bounds == LATENCY_BUCKETS and h.count == 5
    assert math.isclose(h.total_s, 62.0004)
    cumulative = dict(zip(h.bounds, h.cumulative(), strict=False))
    assert cumulative[0.0001] == 2  # bounds are inclusive ("le")
    assert cumulative[0.0005] == 3 and cumulative[2.5] == 4
    assert h.cumulative()[-1] == 5  # 60 s only in +Inf
    assert hists["storage_get"].count == 1 and hists["backup"].count == 0


def test_bad_observations_are_refused_and_change_nothing() -> None:
    metrics = CacheMetrics()
    with pytest.raises(KeyError, match="unknown latency"):
        metrics.observe_latency("warp", 1.0)  # type: ignore[arg-type]
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="finite"):
            metrics.observe_latency("backup", bad)
    with pytest.raises(KeyError, match="unknown counter"):
        metrics.add("matched_tokens")
    assert all(h.count == 0 for h in metrics.histograms().values())
    assert metrics.snapshot() == CacheStats()
