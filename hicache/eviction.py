"""Device and host eviction: LRU/LFU over leaves, demotion, write-back."""

from __future__ import annotations

import heapq
import logging
from typing import NamedTuple

from hicache.cache_state import CacheState
from hicache.radix_tree import TreeNode
from hicache.results import (
    EvictResult,
)

logger = logging.getLogger("hicache.cache")


class _WriteBackOutcome(NamedTuple):
    demoted: int
    deleted: int
    lost: int  # counted as freed while popping, but kept after all


class EvictionMixin(CacheState):
    """HiRadixCache's eviction policy (owner thread only; see HiRadixCache)."""

    def evict(self, num_tokens: int) -> EvictResult:
        """Free at least ``num_tokens`` device tokens if unlocked leaves allow it,
        least recently (or least frequently) used first. A leaf with a host copy
        is demoted (stays, host-only); under ``write_back`` a leaf without one is
        backed up first (waiting for the copy); otherwise it is deleted."""
        total = EvictResult(0, 0, 0)
        while total.freed < num_tokens:
            step = self._evict_pass(num_tokens - total.freed)
            if step.freed == 0:
                break
            total = EvictResult(*(a + b for a, b in zip(total, step, strict=True)))
        return total

    def _evict_pass(self, num_tokens: int) -> EvictResult:
        """One sweep over the current leaves; write-backs land at its end, so
        their parents become leaves only for the next sweep."""
        heap = [(self._priority(n), n.id, n) for n in self._leaves]
        heapq.heapify(heap)
        freed = demoted = deleted = 0
        write_back: list[TreeNode] = []
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            freed += len(node.key)
            if node.host is not None:
                demoted += len(node.key)
                self._demote(node)
            elif self._needs_write_back(node):
                write_back.append(node)
                continue  # its parent stays on device until the backup lands
            else:
                deleted += len(node.key)
                self._delete_device_leaf(node)
            if parent is not None and parent in self._leaves:
                heapq.heappush(heap, (self._priority(parent), parent.id, parent))
        back = self._write_back(write_back)
        return EvictResult(freed - back.lost, demoted + back.demoted, deleted + back.deleted)

    def _needs_write_back(self, node: TreeNode) -> bool:
        # Host-only children would be orphaned by deleting their parent, so such
        # a node is backed up whatever the policy.
        if self.host_pool is None:
            return False
        return self._policy.write_policy == "write_back" or bool(node.children)

    def _write_back(self, nodes: list[TreeNode]) -> _WriteBackOutcome:
        """Back ``nodes`` up synchronously, then demote them; nodes that could
        not be backed up are deleted, or kept when they have children."""
        ops = {node: self._backup(node) for node in nodes}
        demoted = deleted = lost = 0
        for node, op in ops.items():
            if op is not None:
                self._apply(self._transfer().wait(op))
            if node.host is not None and node.lock_ref == 0:
                demoted += len(node.key)
                self._demote(node)
            elif not node.children and node.lock_ref == 0 and node.device is not None:
                deleted += len(node.key)
                self._delete_device_leaf(node)
            else:
                lost += len(node.key)
        return _WriteBackOutcome(demoted, deleted, lost)

    def _priority(self, node: TreeNode) -> tuple[int, int]:
        if self._policy.eviction == "lfu":
            return (node.hit_count, node.last_access)
        return (node.last_access, 0)

    def _drop_device(self, node: TreeNode) -> None:
        assert node.device is not None and node.lock_ref == 0
        self.device_pool.allocator.free(node.device)
        self._evictable -= len(node.key)
        node.device = None
        self._leaves.discard(node)
        self._bad_device.discard(node)
        if node.parent is not None:
            self._refresh_leaf(node.parent)

    def _demote(self, node: TreeNode) -> None:
        """Device copy freed; the node lives on, host-only."""
        self.metrics.add("demoted_tokens_device", len(node.key))
        self._emit_removed(node, "device")
        self._drop_device(node)

    def _delete_device_leaf(self, node: TreeNode) -> None:
        self.metrics.add("evicted_tokens_device", len(node.key))
        self._emit_removed(node, "device")
        self._drop_device(node)
        if node.host is None and not node.children:
            self.tree.remove_leaf(node)

    def evict_host(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` host tokens from host-only leaves with
        ``host_ref == 0``, LRU first; the nodes are deleted (their pages may live
        on in storage). Returns the tokens freed."""
        if self.host_pool is None:
            return 0
        heap = [(self._priority(n), n.id, n) for n in self.tree.nodes() if self._host_leaf(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            freed += len(node.key)
            self._delete_host_leaf(node)
            if parent is not None and self._host_leaf(parent):
                heapq.heappush(heap, (self._priority(parent), parent.id, parent))
        return freed

    def _host_leaf(self, node: TreeNode) -> bool:
        return (
            node.tree is self.tree
            and node is not self.tree.root
            and node.device is None
            and node.host is not None
            and node.host_ref == 0
            and not node.children
        )

    def _delete_host_leaf(self, node: TreeNode) -> None:
        assert node.host is not None and self.host_pool is not None
        self.metrics.add("evicted_tokens_host", len(node.key))
        self._emit_removed(node, "host")
        self.host_pool.allocator.free(node.host)
        node.host = None
        self.tree.remove_leaf(node)

    def _refresh_leaf(self, node: TreeNode) -> None:
        """Keep ``_leaves`` = unlocked device nodes with no device child."""
        if (
            node.tree is not None
            and node is not self.tree.root
            and node.device is not None
            and node.lock_ref == 0
            and not node.has_device_child()
        ):
            self._leaves.add(node)
        else:
            self._leaves.discard(node)

    def _on_new_device_node(self, node: TreeNode) -> None:
        self._refresh_leaf(node)
        if node.parent is not None:
            self._leaves.discard(node.parent)

    def _add_device_tokens(self, node: TreeNode) -> None:
        if node.lock_ref:
            self._protected += len(node.key)
        else:
            self._evictable += len(node.key)
