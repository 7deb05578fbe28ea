from __future__ import annotations

import dataclasses
import urllib.request
from dataclasses import replace
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from hicache.cache import HiRadixCache
from hicache.config.cache import MetricsConfig
from hicache.events.kv import PublisherStats
from hicache.observe.metrics import CacheMetrics, CacheStats
from hicache.observe.prometheus import COUNTERS, Gauges, MetricsServer
from storage_backends import StorageConfig
from tests.hicache.helpers import serve, two_tier
from tests.polling import wait_until

UNITS = ("_tokens", "_bytes", "_seconds", "_requests", "_prefetches", "_errors", "_pages")


def scrape(port: int) -> dict[str, list[Sample]]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    families = {f.name: f for f in text_string_to_metric_families(body)}
    for name, family in families.items():
        assert name.startswith("hicache_"), name
        assert len(family.documentation) > 20, f"{name} lacks a HELP text"
    return {name: f.samples for name, f in families.items()}


def value(samples: list[Sample], name: str, **labels: str) -> float:
    (hit,) = [s.value for s in samples if s.name == name and s.labels == labels]
    return hit


def test_every_counter_is_exported_once_under_a_unit_named_family() -> None:
    fields = [f for fam in COUNTERS for f in fam.series.values()]
    assert sorted(fields) == sorted(f.name for f in dataclasses.fields(CacheStats))
    for fam in COUNTERS:
        units = ("_tokens", "_bytes", "_errors", "_timeouts", "requests", "prefetches")
        assert fam.name.endswith(units)


def test_endpoint_serves_labelled_counters_histograms_and_gauges() -> None:
    stats = CacheStats(hit_tokens_device=42, hit_tokens_host=5, bytes_d2h=1024, lookup_tokens=60)
    metrics = CacheMetrics()
    metrics.observe_latency("storage_put", 0.002)
    metrics.observe_latency("load_back", 0.2)
    gauges = Gauges(7, 3, 1, device_capacity_tokens=64, host_capacity_tokens=128, bytes_per_token=4)
    publisher = PublisherStats(batches=9, replays=2, replay_errors=1)
    server = MetricsServer(
        "127.0.0.1", 0, lambda: stats, lambda: gauges, metrics.histograms, lambda: publisher
    )
    try:
        got = scrape(server.port)
    finally:
        server.close()
    assert value(got["hicache_hit_tokens"], "hicache_hit_tokens_total", tier="device") == 42
    assert value(got["hicache_hit_tokens"], "hicache_hit_tokens_total", tier="host") == 5
    assert value(got["hicache_transfer_bytes"], "hicache_transfer_bytes_total", link="d2h") == 1024
    assert value(got["hicache_lookup_tokens"], "hicache_lookup_tokens_total") == 60
    ops = got["hicache_storage_operation_seconds"]
    assert value(ops, "hicache_storage_operation_seconds_count", op="put") == 1
    assert value(ops, "hicache_storage_operation_seconds_bucket", op="put", le="0.0025") == 1
    assert value(ops, "hicache_storage_operation_seconds_bucket", op="put", le="0.001") == 0
    assert value(got["hicache_load_back_seconds"], "hicache_load_back_seconds_count") == 1
    assert value(got["hicache_tier_used_tokens"], "hicache_tier_used_tokens", tier="device") == 7
    used = got["hicache_tier_used_bytes"]
    assert value(used, "hicache_tier_used_bytes", tier="host") == 12
    cap = got["hicache_tier_capacity_bytes"]
    assert value(cap, "hicache_tier_capacity_bytes", tier="device") == 256
    assert "hicache_storage_pages" not in got  # no storage tier: no store gauges
    errors = got["hicache_kv_event_replay_errors"]
    assert value(errors, "hicache_kv_event_replay_errors_total") == 1


def test_a_cache_exports_its_tiers_and_latencies(tmp_path: Path) -> None:
    store = StorageConfig(backend="lmdb", path=str(tmp_path / "store"), max_bytes=64 << 20)
    base = two_tier(4, pages=16, storage=store)
    cfg = replace(base.config, metrics=MetricsConfig(port=free_port()))
    base.close()
    cache = HiRadixCache(cfg)
    a = [7000 + i for i in range(16)]
    serve(cache, a)
    cache.drain()
    cache.evict(10**9)
    cache.evict_host(10**9)
    serve(cache, a)  # back from storage
    cache.drain()
    got = scrape(cfg.metrics.port)
    cache.close()
    shape = cache.device_pool.shape
    assert value(got["hicache_tier_capacity_bytes"], "hicache_tier_capacity_bytes",
                 tier="device") == 64 * shape.bytes_per_token  # fmt: skip
    assert value(got["hicache_tier_used_bytes"], "hicache_tier_used_bytes", tier="storage") > 0
    assert value(got["hicache_storage_pages"], "hicache_storage_pages") == 4
    assert value(got["hicache_prefetches"], "hicache_prefetches_total", outcome="complete") == 1
    reads, writes = got["hicache_storage_backend_reads"], got["hicache_storage_backend_writes"]
    assert value(reads, "hicache_storage_backend_reads_total", outcome="hit") == 4
    assert value(writes, "hicache_storage_backend_writes_total", outcome="stored") == 4
    assert value(got["hicache_storage_backend_errors"], "hicache_storage_backend_errors_total") == 0
    # Every latency the cache's parts report has been observed.
    for family in ("load_back", "backup", "prefetch_wait"):
        count = value(got[f"hicache_{family}_seconds"], f"hicache_{family}_seconds_count")
        assert count >= 1, family
    ops = got["hicache_storage_operation_seconds"]
    for op in ("exists", "get", "put"):
        assert value(ops, "hicache_storage_operation_seconds_count", op=op) >= 1, op
    cap = value(ops, "hicache_storage_operation_seconds_bucket", op="put", le="+Inf")
    assert cap == value(ops, "hicache_storage_operation_seconds_count", op="put")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_dead_daemon_shows_as_backend_errors() -> None:
    # Nobody listens: the first request times out and opens the breaker, the rest fail
    # fast; each is a backend error, not only a failed put. (No prefetch: its wait is
    # bounded by the same timeout as the lookup it waits for.)
    from tests.storage_backends.remote.test_remote_link import free_endpoint

    store = StorageConfig(backend="remote", endpoint=free_endpoint(), timeout_s=0.2)
    base = two_tier(4, pages=16, storage=store, prefetch_threshold=10**6)
    cfg = replace(base.config, metrics=MetricsConfig(port=free_port()))
    base.close()
    cache = HiRadixCache(cfg)
    serve(cache, [9000 + i for i in range(16)])
    got: dict[str, list[Sample]] = {}

    def counted() -> bool:
        cache.poll()
        got.update(scrape(cfg.metrics.port))
        writes = got["hicache_storage_backend_writes"]
        return value(writes, "hicache_storage_backend_writes_total", outcome="failed") > 0

    try:
        assert wait_until(counted, 10)
    finally:
        cache.close()
    errors = value(got["hicache_storage_backend_errors"], "hicache_storage_backend_errors_total")
    assert errors >= 2  # the put that timed out, the calls refused after it
