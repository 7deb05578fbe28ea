"""DaemonMetrics: the daemon's Prometheus metrics (own registry) and the STATS reply."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hicache.daemon.shm_plane import ShmStats
from hicache.daemon.store import StoreSize, TenantSize
from hicache.daemon.writer import WriterStats
from storage_backends.remote.protocol import ErrorCode, Op, StatValue

_PREFIX = "hicache_daemon"
# Loopback round trips are tens of microseconds; group commits with fsync reach milliseconds.
_LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 0.5, 2.0)


class _SizeCollector(Collector):
    """Memory and store sizes plus the store's and writer's own counters, read at scrape time."""

    def __init__(self, size: Callable[[], StoreSize], writer: Callable[[], WriterStats]) -> None:
        self._size = size
        self._writer = writer

    def collect(self) -> Iterator[Metric]:
        writer, size = self._writer(), self._size()
        for name, help_text, value in (
            ("commits", "store write transactions of PUTs (group commits)", writer.commits),
            ("committed_put_requests", "PUT requests in those commits", writer.committed_requests),
            ("writer_failures", "write batches that raised (answered INTERNAL)", writer.failures),
            ("corrupt_pages", "stored pages found damaged and dropped", size.store_corrupt),
            ("put_failures", "pages the store could not write", size.store_put_failures),
        ):
            yield _counter(name, help_text, value)
        for tier, entries, used in (
            ("memory", size.memory_entries, size.memory_bytes),
            ("store", size.store_entries, size.store_bytes),
        ):
            yield _gauge(f"{tier}_pages", f"pages held in the {tier} tier", entries)
            yield _gauge(f"{tier}_used_bytes", f"bytes held in the {tier} tier", used)
        yield _gauge(
            "store_capacity_bytes", "bytes the store tier may hold", size.store_capacity_bytes
        )
        evictions = CounterMetricFamily(
            f"{_PREFIX}_evictions", "pages evicted for capacity", labels=["tier"]
        )
        evictions.add_metric(["memory"], size.memory_evictions)
        evictions.add_metric(["store"], size.store_evictions)
        yield evictions


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    counter = CounterMetricFamily(f"{_PREFIX}_{name}", help_text)
    counter.add_metric([], value)
    return counter


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(f"{_PREFIX}_{name}", help_text)
    gauge.add_metric([], value)
    return gauge


class DaemonMetrics:
    """Counters, gauges and latency histograms of one daemon. Thread-safe (prometheus_client).

    ``serve_http`` starts the scrape endpoint; ``snapshot`` flattens every sample
    (histogram buckets left out) for the STATS reply.
    """

    def __init__(self, size: Callable[[], StoreSize], writer: Callable[[], WriterStats]) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.requests = Counter(f"{_PREFIX}_requests", "requests answered", ["op"], registry=reg)
        self.errors = Counter(f"{_PREFIX}_errors", "error replies by code", ["code"], registry=reg)
        self.lookups = Counter(
            f"{_PREFIX}_lookups",
            "GET keys by result (hit, miss) and tier that served the hit",
            ["result", "tier"],
            registry=reg,
        )
        self.received = Counter(
            f"{_PREFIX}_received_bytes", "bytes of requests received", registry=reg
        )
        self.sent = Counter(f"{_PREFIX}_sent_bytes", "bytes of replies sent", registry=reg)
        self.tenant_requests = Counter(
            f"{_PREFIX}_tenant_requests",
            "requests received, by tenant",
            ["tenant", "op"],
            registry=reg,
        )
        self.peers = Gauge(f"{_PREFIX}_peers", "client connections open", registry=reg)
        self.in_flight = Gauge(
            f"{_PREFIX}_in_flight_requests", "writes waiting for their commit", registry=reg
        )
        self.queued_reads = Gauge(
            f"{_PREFIX}_queued_reads",
            "reads (GET, EXISTS, CONTAINS) waiting for a reader thread",
            registry=reg,
        )
        self.reply_bytes = Gauge(
            f"{_PREFIX}_queued_reply_bytes",
            "page bytes of GET replies being read or queued for clients that have not taken them",
            registry=reg,
        )
        self.reply_buffers = Gauge(
            f"{_PREFIX}_reply_buffers_lent",
            "store reads' reply buffers out with replies ZeroMQ has not finished sending",
            registry=reg,
        )
        self.reply_tampered = Gauge(
            f"{_PREFIX}_reply_buffers_tampered",
            "free reply buffers found written before they were lent again "
            "(counted with HICACHE_DAEMON_POISON=1 only)",
            registry=reg,
        )
        self.sweep_failures = Counter(
            f"{_PREFIX}_sweep_failures",
            "sweeps of sent replies or shared-memory leases that raised (a bug; logged)",
            registry=reg,
        )
        self.read_failures = Counter(
            f"{_PREFIX}_reader_failures", "reads that raised (answered INTERNAL)", registry=reg
        )
        self.latency = Histogram(
            f"{_PREFIX}_request_duration_seconds",
            "time from receiving a request to sending its reply",
            ["op"],
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        reg.register(_SizeCollector(size, writer))
        # Labelled children looked up once: a labels() call per request costs more than
        # the request's own bookkeeping on the socket thread.
        self._answered = {op: self.requests.labels(op=op.value) for op in Op}
        self._latency = {op: self.latency.labels(op=op.value) for op in Op}
        self._by_tenant: dict[tuple[str, Op], Counter] = {}
        self._hits = {
            tier: self.lookups.labels(result="hit", tier=tier) for tier in ("memory", "store")
        }
        self._misses = self.lookups.labels(result="miss", tier="none")
        for op in Op:  # every label present from the start, so dashboards see zeros
            self.requests.labels(op=op.value)
        for code in ErrorCode:
            self.errors.labels(code=code.value)
        self._http: tuple[object, threading.Thread] | None = None

    def watch_shm(self, stats: Callable[[], ShmStats]) -> None:
        """Report the shared-memory slab's leases and lent bytes (read at each scrape)."""
        reg = self.registry
        leases = Gauge(f"{_PREFIX}_shm_leases", "shared-memory leases held", registry=reg)
        lent = Gauge(
            f"{_PREFIX}_shm_lent_bytes",
            "shared-memory slab bytes lent to clients (put areas and GET slots)",
            registry=reg,
        )
        leases.set_function(lambda: stats().leases)
        lent.set_function(lambda: stats().lent_bytes)

    def answered(self, op: Op, seconds: float) -> None:
        """A reply to a request of ``op`` went out ``seconds`` after it came in."""
        self._answered[op].inc()
        self._latency[op].observe(seconds)

    def tenant_request(self, tenant: str, op: Op) -> None:
        """``tenant`` sent a request of ``op``."""
        child = self._by_tenant.get((tenant, op))
        if child is None:  # one per (tenant, op): bounded by the configured tenants
            child = self._by_tenant[(tenant, op)] = self.tenant_requests.labels(
                tenant=tenant, op=op.value
            )
        child.inc()

    def looked_up(self, memory_hits: int, store_hits: int, misses: int) -> None:
        """GET keys served from memory, from the store, and not found."""
        self._hits["memory"].inc(memory_hits)
        self._hits["store"].inc(store_hits)
        self._misses.inc(misses)

    def serve_http(self, host: str, port: int) -> int:
        """Start the scrape endpoint; return its port (``port`` 0: OS-picked)."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        self._http = (server, thread)
        return int(server.server_port)

    def snapshot(self) -> dict[str, StatValue]:
        """Every sample as ``name{label="value"}`` → value, histogram buckets left out."""
        stats: dict[str, StatValue] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith(("_bucket", "_created")):
                    continue
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                stats[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return stats

    def tenant_snapshot(self, tenant: str, size: TenantSize | None) -> dict[str, StatValue]:
        """What a tenant may see: its own requests (as ``requests_total``) and, when it has
        a store of its own, that store's size under the whole daemon's names."""
        stats: dict[str, StatValue] = {}
        for family in self.tenant_requests.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels["tenant"] == tenant:
                    op = sample.labels["op"]
                    stats[f'{_PREFIX}_requests_total{{op="{op}"}}'] = sample.value
        if size is not None:
            stats[f"{_PREFIX}_store_pages"] = size.store_entries
            stats[f"{_PREFIX}_store_used_bytes"] = size.store_bytes
            stats[f"{_PREFIX}_store_capacity_bytes"] = size.store_capacity_bytes
            stats[f'{_PREFIX}_evictions_total{{tier="store"}}'] = size.store_evictions
        return stats

    def close(self) -> None:
        if self._http is not None:
            server, thread = self._http
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]
            thread.join(timeout=5)
            self._http = None
