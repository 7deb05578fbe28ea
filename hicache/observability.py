"""KV events and counters emitted by HiRadixCache."""

from __future__ import annotations

import logging
from dataclasses import replace

from hicache.cache_state import CacheState
from hicache.events import BlockRemoved, BlockStored, Medium
from hicache.metrics import CacheStats
from hicache.prometheus import Gauges
from hicache.radix_tree import TreeNode

logger = logging.getLogger("hicache.cache")


class ObservabilityMixin(CacheState):
    """Events for every store/remove on every tier, and stats (see HiRadixCache)."""

    def _stored_event(self, node: TreeNode, medium: Medium) -> BlockStored | None:
        """The event announcing ``node``'s pages in ``medium`` (None: events off)."""
        if self.events is None:
            return None
        assert node.parent is not None
        parent = None if node.parent is self.tree.root else self.node_page_keys(node.parent)[-1]
        keys = tuple(self.node_page_keys(node))
        return BlockStored(keys, parent, tuple(node.key), self.page_size, node.namespace, medium)

    def _emit_stored(self, node: TreeNode, medium: Medium) -> None:
        event = self._stored_event(node, medium)
        if event is not None and self.events is not None:
            self.events.emit(event)

    def _emit_leading(self, event: BlockStored | None, pages: int) -> None:
        """Emit the first ``pages`` pages of ``event``: a store that kept only a
        prefix of a node announces only that prefix (a chain has no gaps)."""
        if event is None or self.events is None or pages == 0:
            return
        tokens = event.token_ids[: pages * event.block_size]
        self.events.emit(replace(event, block_hashes=event.block_hashes[:pages], token_ids=tokens))

    def _emit_removed(self, node: TreeNode, medium: Medium) -> None:
        # A failed load never announced its device copy, so it is not withdrawn.
        if self.events is not None and not (medium == "device" and node in self._bad_device):
            self.events.emit(BlockRemoved(tuple(self.node_page_keys(node)), medium))

    def _announce_storage_removals(self) -> None:
        """Pages the backend evicted, deleted or dropped as damaged. Taken even
        with events off, so that the backend's journal stays empty."""
        if self.storage is None:
            return
        removed = self.storage.backend.take_removed()
        if removed and self.events is not None:
            self.events.emit(BlockRemoved(tuple(removed), "storage"))

    def stats(self) -> CacheStats:
        """A snapshot of the cache's counters (thread-safe)."""
        return self.metrics.snapshot()

    def _gauges(self) -> Gauges:
        """Sizes for a Prometheus scrape (runs on the scrape thread: reads only)."""
        host = host_capacity = storage_bytes = storage_capacity = storage_pages = 0
        if self.host_pool is not None:
            alloc = self.host_pool.allocator
            host, host_capacity = alloc.capacity - alloc.available(), alloc.capacity
        if self.storage is not None:
            store = self.storage.backend.stats()
            storage_bytes, storage_capacity = store.bytes_used, store.capacity_bytes
            storage_pages = store.entries
        return Gauges(
            self.device_tokens(),
            host,
            self._protected,
            device_capacity_tokens=self.device_pool.allocator.capacity,
            host_capacity_tokens=host_capacity,
            bytes_per_token=self.device_pool.shape.bytes_per_token,
            storage_bytes=storage_bytes,
            storage_capacity_bytes=storage_capacity,
            storage_pages=storage_pages,
        )
