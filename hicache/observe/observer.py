"""The observer: KV events for every store/remove on every tier, and metrics.

``Observer`` owns the event sink (ZeroMQ PUB when configured), the counters
(``CacheMetrics``) and the Prometheus server. It reads nodes to name their
pages and changes nothing outside itself. Owner thread only, except
``metrics`` (thread-safe snapshots) and the server's collector thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from hicache.config.cache import CacheConfig
from hicache.events.kv import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventSink,
    Medium,
    ZmqEventPublisher,
)
from hicache.keys.hashing import NodeKeys
from hicache.observe.metrics import CacheMetrics, CacheStats, Latency
from hicache.observe.prometheus import Gauges, MetricsServer
from hicache.policies.rates import Clock, Rates
from hicache.tree.radix_tree import TreeNode
from transfer.storage_io import OpTiming

STORAGE_OPS: Mapping[str, Latency] = MappingProxyType(
    {"exists": "storage_exists", "get": "storage_get", "put": "storage_put"}
)


class Observer:
    """Events and metrics of one cache (see the module docstring)."""

    def __init__(
        self, config: CacheConfig, keys: NodeKeys, gauges: Callable[[], Gauges], clock: Clock
    ) -> None:
        self.metrics = CacheMetrics()
        # Measured bandwidths and prefill speed (the ``cost`` policy reads them).
        self.rates = Rates(clock, config.storage.backend, config.policy.prefill_tokens_per_s)
        self._keys = keys
        self.events: EventSink | None = None
        if config.events.endpoint:
            self.events = ZmqEventPublisher.from_config(config.events, config.storage.backend)
        self._server: MetricsServer | None = None
        if config.metrics.port:
            publisher = self.events.stats if isinstance(self.events, ZmqEventPublisher) else None
            self._server = MetricsServer(
                config.metrics.host,
                config.metrics.port,
                self.metrics.snapshot,
                gauges,
                self.metrics.histograms,
                publisher,
            )

    def stats(self) -> CacheStats:
        return self.metrics.snapshot()

    def latency(self, kind: Latency, seconds: float) -> None:
        """Count one ``kind`` operation of ``seconds`` (see ``CacheMetrics``)."""
        self.metrics.observe_latency(kind, seconds)

    def storage_calls(self, timings: Iterable[OpTiming]) -> None:
        """Count the backend calls a storage job made, by operation."""
        for t in timings:
            self.metrics.observe_latency(STORAGE_OPS[t.op], t.seconds)

    def stored_event(self, node: TreeNode, medium: Medium) -> BlockStored | None:
        """The event announcing ``node``'s pages in ``medium`` (None: events off)."""
        if self.events is None:
            return None
        keys = tuple(self._keys.of(node))
        parent = self._keys.event_parent(node)
        return BlockStored(
            keys, parent, tuple(node.key), self._keys.page_size, node.namespace, medium
        )

    def stored(self, node: TreeNode, medium: Medium) -> None:
        event = self.stored_event(node, medium)
        if event is not None and self.events is not None:
            self.events.emit(event)

    def stored_leading(self, event: BlockStored | None, pages: int) -> None:
        """Emit the first ``pages`` pages of ``event``: a store that kept only a
        prefix of a node announces only that prefix (a chain has no gaps)."""
        if event is None or self.events is None or pages == 0:
            return
        tokens = event.token_ids[: pages * event.block_size]
        self.events.emit(replace(event, block_hashes=event.block_hashes[:pages], token_ids=tokens))

    def removed(self, node: TreeNode, medium: Medium) -> None:
        if self.events is not None:
            self.events.emit(BlockRemoved(tuple(self._keys.of(node)), medium))

    def storage_removed(self, keys: tuple[bytes, ...]) -> None:
        """Pages the backend evicted, deleted or dropped as damaged."""
        if keys and self.events is not None:
            self.events.emit(BlockRemoved(keys, "storage"))

    def cleared(self) -> None:
        if self.events is not None:
            self.events.emit(AllBlocksCleared())
            self.events.flush()

    def flush(self) -> None:
        if self.events is not None:
            self.events.flush()

    def close(self) -> None:
        if self.events is not None:
            self.events.close()
            self.events = None
        if self._server is not None:
            self._server.close()
            self._server = None

    def check(self) -> None:
        """Counters never go negative."""
        assert all(v >= 0 for v in self.metrics.snapshot().as_dict().values()), "negative counter"
