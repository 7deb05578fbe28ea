"""Expose a cache's counters, latencies and sizes as Prometheus metrics over
HTTP (``metrics.port``).

Names follow Prometheus's conventions: a ``hicache_`` prefix, the unit last
(``_tokens``, ``_bytes``, ``_seconds``; ``_total`` after it for counters), and
one family per quantity with labels (``tier``, ``link``, ``outcome``, ``op``)
instead of a name per tier or link.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import NamedTuple

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from hicache.events.kv import PublisherStats
from hicache.observe.metrics import LATENCIES, PREFETCH_OUTCOMES, CacheStats, Histogram, Latency
from hicache.policies.rates import RatesSnapshot
from storage_backends import StorageStats


class Gauges(NamedTuple):
    """Point-in-time sizes, read when Prometheus scrapes. Tokens for the
    device and host tiers (bytes = tokens x ``bytes_per_token``); bytes and
    pages for the store. Capacities left at 0 are not exported."""

    device_tokens: int
    host_tokens: int
    protected_tokens: int
    device_capacity_tokens: int = 0
    host_capacity_tokens: int = 0
    bytes_per_token: int = 0
    storage_bytes: int = 0
    storage_capacity_bytes: int = 0
    storage_pages: int = 0
    storage: StorageStats | None = None  # the backend's own counters (None: no store)
    rates: RatesSnapshot | None = None  # measured bandwidths and prefill speed


class Family(NamedTuple):
    """One exported counter family; ``series`` maps label values to the
    CacheStats field that holds each series."""

    name: str
    help: str
    label: str
    series: Mapping[str, str]


COUNTERS: tuple[Family, ...] = (
    Family("requests", "Prefix lookups (match_prefix calls), about one per request.", "",
           {"": "requests"}),
    Family("lookup_tokens", "Tokens looked up by match_prefix: hits on every tier plus misses.",
           "", {"": "lookup_tokens"}),
    Family("hit_tokens", "Looked-up tokens found cached, by the tier that held them.", "tier",
           {t: f"hit_tokens_{t}" for t in ("device", "host", "storage")}),
    Family("miss_tokens", "Looked-up tokens cached on no tier (to be computed).", "",
           {"": "miss_tokens"}),
    Family("inserted_tokens", "Tokens newly inserted into the tree after a forward pass.", "",
           {"": "inserted_tokens"}),
    Family("evicted_tokens", "Tokens freed from a tier with their node (device: no host copy "
           "kept; host: storage may keep the pages).",
           "tier", {"device": "evicted_tokens_device", "host": "evicted_tokens_host"}),
    Family("demoted_tokens", "Device tokens evicted while a host copy stays (device -> host).",
           "", {"": "demoted_tokens_device"}),
    Family("transfer_bytes", "KV bytes moved, by link: d2h backup, h2d load-back, "
           "h2s storage write, s2h prefetch.", "link",
           {k: f"bytes_{k}" for k in ("d2h", "h2d", "h2s", "s2h")}),
    Family("transfer_errors", "Failed transfers or storage jobs, by link (a miss, never a crash).",
           "link", {k: f"errors_{k}" for k in ("d2h", "h2d", "h2s", "s2h")}),
    Family("prefetches", "Storage prefetches: started, then one outcome each when it "
           "finishes: complete, partial (a leading part), miss (storage held none of the "
           "pages), below_threshold (too few to be worth it), declined (the cost policy judged "
           "recomputing faster than reading them), failed (backend error or unreadable "
           "pages). Only failed is a problem.", "outcome",
           {k: f"prefetch_{k}" for k in PREFETCH_OUTCOMES}),
    Family("cut_prefetches", "Storage reads cut at their deadline (cost policy): the pages "
           "that had arrived were used, the rest recomputed.", "", {"": "prefetch_cuts"}),
    Family("storage_wait_timeouts", "Waits on storage work (drain, reset, close, "
           "wait_prefetch) that gave up after storage.timeout_s; the job lands later.", "",
           {"": "storage_wait_timeouts"}),
)  # fmt: skip

_STORAGE_HELP = "Latency of one storage backend call, by operation."
HISTOGRAMS: Mapping[Latency, tuple[str, str, str]] = MappingProxyType(
    {
        # kind -> (family, help, op label value or "")
        "load_back": (
            "load_back_seconds",
            "Load-back latency: H2D copy submitted until its completion was applied.",
            "",
        ),
        "backup": (
            "backup_seconds",
            "Backup latency: D2H copy submitted until its completion was applied.",
            "",
        ),
        "prefetch_wait": (
            "prefetch_wait_seconds",
            "How long a request waited on its storage prefetch: prefetch() to release_prefetch().",
            "",
        ),
        "storage_exists": ("storage_operation_seconds", _STORAGE_HELP, "exists"),
        "storage_get": ("storage_operation_seconds", _STORAGE_HELP, "get"),
        "storage_put": ("storage_operation_seconds", _STORAGE_HELP, "put"),
    }
)


def counter_families(stats: CacheStats) -> Iterator[Metric]:
    values = stats.as_dict()
    for fam in COUNTERS:
        labels = [fam.label] if fam.label else []
        metric = CounterMetricFamily(f"hicache_{fam.name}", fam.help, labels=labels)
        for label, field in fam.series.items():
            metric.add_metric([label] if fam.label else [], values[field])
        yield metric


def histogram_families(hists: Mapping[Latency, Histogram]) -> Iterator[Metric]:
    families: dict[str, HistogramMetricFamily] = {}
    for kind in LATENCIES:
        name, doc, op = HISTOGRAMS[kind]
        family = families.get(name)
        if family is None:
            family = HistogramMetricFamily(f"hicache_{name}", doc, labels=["op"] if op else [])
            families[name] = family
        h = hists[kind]
        bounds = [repr(b) for b in h.bounds] + ["+Inf"]
        buckets = list(zip(bounds, h.cumulative(), strict=True))
        family.add_metric([op] if op else [], buckets, h.total_s)
    yield from families.values()


def gauge_families(g: Gauges) -> Iterator[Metric]:
    used = GaugeMetricFamily(
        "hicache_tier_used_bytes", "Bytes of KV a tier holds now.", labels=["tier"]
    )
    cap = GaugeMetricFamily(
        "hicache_tier_capacity_bytes", "Bytes of KV a tier can hold.", labels=["tier"]
    )
    tokens = GaugeMetricFamily(
        "hicache_tier_used_tokens", "Tokens of KV a tier holds now.", labels=["tier"]
    )
    cap_tokens = GaugeMetricFamily(
        "hicache_tier_capacity_tokens", "Tokens of KV a tier can hold.", labels=["tier"]
    )
    for tier, n, total in (
        ("device", g.device_tokens, g.device_capacity_tokens),
        ("host", g.host_tokens, g.host_capacity_tokens),
    ):
        tokens.add_metric([tier], n)
        if total:
            cap_tokens.add_metric([tier], total)
        if g.bytes_per_token:
            used.add_metric([tier], n * g.bytes_per_token)
            if total:
                cap.add_metric([tier], total * g.bytes_per_token)
    if g.storage_capacity_bytes:  # a store always has a capacity; 0 = no storage tier
        used.add_metric(["storage"], g.storage_bytes)
        cap.add_metric(["storage"], g.storage_capacity_bytes)
    protected = GaugeMetricFamily(
        "hicache_protected_tokens", "Device tokens locked by running requests (not evictable)."
    )
    protected.add_metric([], g.protected_tokens)
    yield from (tokens, cap_tokens, used, cap, protected)
    if g.storage_capacity_bytes:
        pages = GaugeMetricFamily("hicache_storage_pages", "Pages the store holds now.")
        pages.add_metric([], g.storage_pages)
        yield pages
    if g.storage is not None:
        yield from backend_families(g.storage)
    if g.rates is not None:
        yield from rate_families(g.rates)


def rate_families(r: RatesSnapshot) -> Iterator[Metric]:
    """What the ``cost`` prefetch policy decides with: each link's measured
    bandwidth and its spread (a link not measured yet is left out), and the
    prefill speed per length bucket."""
    bandwidth = GaugeMetricFamily(
        "hicache_link_bandwidth_bytes_per_second",
        "Measured bandwidth of completed loads, by link (h2d: host->device, s2h: "
        "storage->host) and backend: a moving estimate over recent transfers.",
        labels=["link", "backend"],
    )
    spread = GaugeMetricFamily(
        "hicache_link_bandwidth_spread_bytes_per_second",
        "Recent spread (moving standard deviation) of a link's transfer rates.",
        labels=["link", "backend"],
    )
    for link, backend, est in (("h2d", "", r.h2d), ("s2h", r.backend, r.s2h)):
        if est is not None:
            bandwidth.add_metric([link, backend], est.bytes_per_s)
            spread.add_metric([link, backend], est.spread)
    prefill = GaugeMetricFamily(
        "hicache_prefill_tokens_per_second",
        "Measured prefill speed of forward passes reaching up to max_tokens tokens.",
        labels=["max_tokens"],
    )
    for point in r.prefill:
        prefill.add_metric([str(point.length)], point.tokens_per_s)
    yield from (bandwidth, spread, prefill)


# The storage backend's own counters (this process's calls), by family:
# (name, help, label, {label value: StorageStats field}).
BACKEND_COUNTERS: tuple[tuple[str, str, str, Mapping[str, str]], ...] = (
    ("storage_backend_reads", "Pages the storage backend was asked for, by outcome "
     "(a corrupt page is also a miss).", "outcome",
     {"hit": "hits", "miss": "misses", "corrupt": "corrupt"}),
    ("storage_backend_writes", "Pages the storage backend was asked to store, by outcome.",
     "outcome", {"stored": "puts", "failed": "put_failures"}),
    ("storage_backend_removals", "Pages the storage backend removed, by reason.", "reason",
     {"evicted": "evictions", "deleted": "deletes"}),
    ("storage_backend_errors", "Backend calls that failed (exceptions, timeouts, a daemon "
     "down or refusing) and were answered as misses or failed puts.", "", {"": "errors"}),
    ("storage_backend_quarantines", "Whole stores found damaged, moved aside and started "
     "empty.", "", {"": "quarantined"}),
)  # fmt: skip


def backend_families(s: StorageStats) -> Iterator[Metric]:
    for name, doc, label, series in BACKEND_COUNTERS:
        metric = CounterMetricFamily(f"hicache_{name}", doc, labels=[label] if label else [])
        for value, field in series.items():
            metric.add_metric([value] if label else [], getattr(s, field))
        yield metric


def publisher_families(p: PublisherStats) -> Iterator[Metric]:
    for name, doc, val in (
        ("kv_event_batches", "KV event batches published.", p.batches),
        ("kv_event_replays", "KV event replay requests answered.", p.replays),
        ("kv_event_replay_errors", "Malformed KV event replay requests and failed replays.",
         p.replay_errors),
    ):  # fmt: skip
        metric = CounterMetricFamily(f"hicache_{name}", doc)
        metric.add_metric([], val)
        yield metric


class Sources(NamedTuple):
    """What a scrape reads; the optional parts are left out when None."""

    stats: Callable[[], CacheStats]
    gauges: Callable[[], Gauges]
    histograms: Callable[[], Mapping[Latency, Histogram]] | None = None
    publisher: Callable[[], PublisherStats] | None = None


class _CacheCollector(Collector):
    def __init__(self, sources: Sources) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        src = self._sources
        yield from counter_families(src.stats())
        if src.histograms is not None:
            yield from histogram_families(src.histograms())
        yield from gauge_families(src.gauges())
        if src.publisher is not None:
            yield from publisher_families(src.publisher())


class MetricsServer:
    """A Prometheus HTTP endpoint over one cache's counters, latency histograms
    (when ``histograms`` is given), gauges and KV event publisher counters (when
    ``publisher`` is given), with its own registry (never the process-global
    one). ``close()`` stops it. Raises OSError when the port cannot be bound."""

    def __init__(
        self,
        host: str,
        port: int,
        stats: Callable[[], CacheStats],
        gauges: Callable[[], Gauges],
        histograms: Callable[[], Mapping[Latency, Histogram]] | None = None,
        publisher: Callable[[], PublisherStats] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_CacheCollector(Sources(stats, gauges, histograms, publisher)))
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
