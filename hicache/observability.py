"""KV events and counters emitted by HiRadixCache."""

from __future__ import annotations

import logging

from hicache.cache_state import CacheState
from hicache.events import BlockRemoved, BlockStored, Medium
from hicache.metrics import CacheStats
from hicache.prometheus import Gauges
from hicache.radix_tree import TreeNode

logger = logging.getLogger("hicache.cache")


class ObservabilityMixin(CacheState):
    """Events for every store/remove on every tier, and stats (see HiRadixCache)."""

    def _emit_stored(
        self, node: TreeNode, medium: Medium, pages_ok: tuple[bool, ...] | None = None
    ) -> None:
        if self.events is None:
            return
        keys = self.node_page_keys(node)
        assert node.parent is not None
        parent = None if node.parent is self.tree.root else self.node_page_keys(node.parent)[-1]
        if pages_ok is not None and not all(pages_ok):
            n = pages_ok.index(False)  # storage keeps a prefix: report the leading pages
            keys, tokens = keys[:n], node.key[: n * self.page_size]
        else:
            tokens = node.key
        if keys:
            event = BlockStored(
                tuple(keys), parent, tuple(tokens), self.page_size, node.namespace, medium
            )
            self.events.emit(event)

    def _emit_removed(self, node: TreeNode, medium: Medium) -> None:
        # A failed load never announced its device copy, so it is not withdrawn.
        if self.events is not None and not (medium == "device" and node in self._bad_device):
            self.events.emit(BlockRemoved(tuple(self.node_page_keys(node)), medium))

    def stats(self) -> CacheStats:
        """A snapshot of the cache's counters (thread-safe)."""
        return self.metrics.snapshot()

    def _gauges(self) -> Gauges:
        host = 0
        if self.host_pool is not None:
            alloc = self.host_pool.allocator
            host = alloc.capacity - alloc.available()
        return Gauges(self.device_tokens(), host, self._protected)
