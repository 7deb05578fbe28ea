"""docs/grafana/hicache.json queries only metrics and label values that the
cache and the daemon really export (collected from their registries here)."""

from __future__ import annotations

import json
import re
import urllib.request
from dataclasses import replace
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from hicache.cache import HiRadixCache
from hicache.config.cache import EventsConfig, MetricsConfig
from hicache.daemon.metrics import DaemonMetrics
from hicache.daemon.store import StoreSize
from hicache.daemon.writer import WriterStats
from storage_backends import StorageConfig
from tests.hicache.helpers import serve, two_tier
from tests.hicache.observe.test_prometheus import free_port

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "hicache.json"
METRIC = re.compile(r"\b(hicache_[a-z0-9_]+)(\{[^}]*\})?")
MATCHER = re.compile(r'(\w+)\s*(=|!=)\s*"([^"]*)"')
# What the dashboard must show (the list), as metric names it must query.
REQUIRED = (
    "hicache_hit_tokens_total",  # hit rate by tier
    "hicache_transfer_bytes_total",  # bytes per link
    "hicache_load_back_seconds_bucket",
    "hicache_prefetch_wait_seconds_bucket",
    "hicache_tier_used_bytes",  # store bytes
    "hicache_daemon_store_used_bytes",
    "hicache_daemon_requests_total",
    "hicache_daemon_errors_total",
    "hicache_storage_backend_errors_total",  # a daemon down, refusing or timing out
)
Samples = dict[str, list[dict[str, str]]]  # sample name -> the label sets exported


def samples_of(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(dict(s.labels))
    return out


def cache_samples(tmp_path: Path) -> Samples:
    """A cache with every part on (host, LMDB store, KV events), scraped over HTTP."""
    store = StorageConfig(backend="lmdb", path=str(tmp_path / "store"), max_bytes=64 << 20)
    base = two_tier(4, pages=16, storage=store)
    port = free_port()
    events = EventsConfig(endpoint="tcp://127.0.0.1:*")
    cfg = replace(base.config, metrics=MetricsConfig(port=port), events=events)
    base.close()
    cache = HiRadixCache(cfg)
    try:
        serve(cache, list(range(16)))
        cache.drain()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        cache.close()
    return samples_of(body.decode())


def daemon_samples() -> Samples:
    """The daemon's registry, as ``hicache serve`` builds it, with one latency observed."""
    size = StoreSize(1, 10, 0, 1, 10, 0, 0, 0, 100)
    metrics = DaemonMetrics(lambda: size, lambda: WriterStats(0, 0, 0))
    metrics.latency.labels(op="GET").observe(0.001)
    metrics.lookups.labels(result="hit", tier="memory").inc()
    from prometheus_client import generate_latest

    return samples_of(generate_latest(metrics.registry).decode())


def queries() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]


def test_every_query_names_an_exported_metric_and_label_value(tmp_path: Path) -> None:
    exported = cache_samples(tmp_path) | daemon_samples()
    used: set[str] = set()
    for expr in queries():
        found = METRIC.findall(expr)
        assert found, f"a query names no hicache metric: {expr}"
        for name, braces in found:
            assert name in exported, f"{name} is not exported (in {expr})"
            used.add(name)
            for label, op, value in MATCHER.findall(braces):
                if label == "job" or op != "=":
                    continue
                values = {labels.get(label) for labels in exported[name]}
                assert value in values, f'{name}{{{label}="{value}"}} is never exported'
    missing = [name for name in REQUIRED if name not in used]
    assert not missing, f"the dashboard does not show {missing}"


def test_the_dashboard_is_importable_json() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] == "hicache" and doc["panels"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    names = {v["name"] for v in doc["templating"]["list"]}
    assert {"datasource", "job"} <= names
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
