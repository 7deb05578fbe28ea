"""Expose CacheStats as Prometheus metrics over HTTP (``metrics.port``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hicache.metrics import CacheStats


class Gauges(NamedTuple):
    """Point-in-time sizes, read when Prometheus scrapes."""

    device_tokens: int
    host_tokens: int
    protected_tokens: int


class _StatsCollector(Collector):
    def __init__(self, stats: Callable[[], CacheStats], gauges: Callable[[], Gauges]) -> None:
        self._stats = stats
        self._gauges = gauges

    def collect(self) -> Iterator[Metric]:
        for name, value in self._stats().as_dict().items():
            counter = CounterMetricFamily(f"hicache_{name}", f"hicache counter {name}")
            counter.add_metric([], value)
            yield counter
        for name, value in self._gauges()._asdict().items():
            gauge = GaugeMetricFamily(f"hicache_{name}", f"hicache gauge {name}")
            gauge.add_metric([], value)
            yield gauge


class MetricsServer:
    """A Prometheus HTTP endpoint over one cache's counters, with its own
    registry (never the process-global one). ``close()`` stops it."""

    def __init__(
        self,
        host: str,
        port: int,
        stats: Callable[[], CacheStats],
        gauges: Callable[[], Gauges],
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_StatsCollector(stats, gauges))
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
