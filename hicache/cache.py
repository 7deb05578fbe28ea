"""HiRadixCache: the engine-facing tree_cache that composes tree, pools and tiers."""

from __future__ import annotations

import heapq
import logging
from collections.abc import Sequence

import torch

from device_pool import DeviceKVPool, tokens_for_bytes
from hicache.config import CacheConfig
from hicache.hashing import model_fingerprint, page_keys
from hicache.integrity import check_tree
from hicache.radix_tree import Key, RadixTree, TreeNode, as_token_list
from hicache.results import EvictResult, InsertResult, MatchResult, UnfinishedResult

logger = logging.getLogger(__name__)
Tokens = Sequence[int] | torch.Tensor


class CacheError(ValueError):
    """A call the cache refuses: bad node, bad lock, bad slots. Nothing was changed."""


class HiRadixCache:
    """Radix cache of KV pages across device, host and storage tiers.

    Threading: one owner thread (the engine's scheduler) calls every method;
    it is the only one that mutates the tree and the allocators. Background
    transfer and storage workers report completions that ``poll()`` applies.
    Errors: bad input raises ``ValueError`` (``CacheError`` for misuse of
    nodes, locks and slots) before anything is changed.
    """

    def __init__(self, config: CacheConfig, device_pool: DeviceKVPool | None = None) -> None:
        self.config = config
        self.page_size = config.device.page_size
        self.device_pool = device_pool or _build_device_pool(config)
        if self.device_pool.page_size != self.page_size:
            raise ValueError("device pool page_size differs from device.page_size")
        self.tree = RadixTree(self.page_size)
        self.fingerprint = model_fingerprint(config.model, self.page_size)
        self._lfu = config.policy.eviction == "lfu"
        self._evictable = 0
        self._protected = 0
        self._request_held = 0
        self._leaves: set[TreeNode] = set()
        self.host_pool = None  # the host tier arrives with the transfer engine

    # ----------------------------------------------------------------- match
    def match_prefix(self, tokens: Tokens, namespace: str | None = None) -> MatchResult:
        """Longest cached page-aligned prefix of ``tokens``; splits a node when
        the match ends inside it and refreshes LRU/LFU state along the path."""
        key = as_token_list(tokens)
        key = key[: len(key) // self.page_size * self.page_size]
        walk = self.tree.walk(key, namespace, split=True)
        now = self.tree.tick()
        last_device, host_len, device_parts = self.tree.root, 0, []
        for node in walk.path:
            node.last_access = now
            node.hit_count += 1
            if node.device is not None:
                last_device = node
                device_parts.append(node.device)
            else:
                host_len += len(node.key)
        indices = torch.cat(device_parts) if device_parts else _empty()
        return MatchResult(indices, last_device, walk.node, host_len)

    # ---------------------------------------------------------------- insert
    def insert(
        self, tokens: Tokens, device_slots: torch.Tensor, namespace: str | None = None
    ) -> InsertResult:
        """Cache the whole pages of ``tokens`` whose KV is at ``device_slots``.

        Call only after the forward pass has written that KV. The slots are
        the request's; pages the tree already holds keep the tree's slots and
        the request's duplicates are freed; new pages pass to the tree.
        """
        key = as_token_list(tokens)
        self._check_slots(device_slots, len(key))
        aligned = len(key) // self.page_size * self.page_size
        return self._insert(key[:aligned], device_slots[:aligned], namespace)

    def _insert(self, key: Key, slots: torch.Tensor, ns: str | None) -> InsertResult:
        walk = self.tree.walk(key, ns, split=True)
        pos, now = 0, self.tree.tick()
        for node in walk.path:
            node.last_access = now
            self._absorb(node, slots[pos : pos + len(node.key)])
            pos += len(node.key)
        prefix_len, node = walk.length, walk.node
        if pos < len(key):
            node = self.tree.add_child(node, key[pos:], ns)
            node.last_access = now
            node.device = slots[pos:].clone()
            self._request_held -= len(node.key)
            self._evictable += len(node.key)
            self._on_new_device_node(node)
        return InsertResult(prefix_len, node)

    def _absorb(self, node: TreeNode, slots: torch.Tensor) -> None:
        """The request also computed ``node``'s pages: keep one copy."""
        if node.device is None:
            node.device = slots.clone()  # revive a host-only node with the fresh KV
            self._request_held -= len(slots)
            self._add_device_tokens(node)
            self._on_new_device_node(node)
            return
        dup = slots[node.device != slots]
        if dup.numel():
            self._free_request_slots(dup)

    def cache_finished_req(
        self,
        tokens: Tokens,
        device_slots: torch.Tensor,
        last_node: TreeNode,
        namespace: str | None = None,
    ) -> InsertResult:
        """A request is done: insert its KV, free its duplicates and its partial
        tail page, and drop the lock it held on ``last_node`` (from its match)."""
        key = as_token_list(tokens)
        self._check_slots(device_slots, len(key))
        self._check_node(last_node, locked=True)
        aligned = len(key) // self.page_size * self.page_size
        result = self._insert(key[:aligned], device_slots[:aligned], namespace)
        self.dec_lock_ref(last_node)
        if aligned < len(key):
            self._free_request_slots(self._tail_page(device_slots[aligned]))
        return result

    def cache_unfinished_req(
        self,
        tokens: Tokens,
        device_slots: torch.Tensor,
        last_node: TreeNode,
        namespace: str | None = None,
    ) -> UnfinishedResult:
        """Mid-request (chunked prefill, decode): insert what is computed so far
        and move the request's lock from ``last_node`` to the new last node.
        The partial tail page stays the request's."""
        key = as_token_list(tokens)
        self._check_slots(device_slots, len(key))
        self._check_node(last_node, locked=True)
        aligned = len(key) // self.page_size * self.page_size
        result = self._insert(key[:aligned], device_slots[:aligned], namespace)
        self.inc_lock_ref(result.last_node)
        self.dec_lock_ref(last_node)
        parts = [n.device for n in reversed(list(self.tree.path_to_root(result.last_node)))]
        indices = torch.cat(parts) if parts else _empty()
        return UnfinishedResult(indices, result.last_node, result.prefix_len)

    # ----------------------------------------------------------------- locks
    def inc_lock_ref(self, node: TreeNode) -> None:
        """Pin ``node`` and its ancestors on device (they will not be evicted)."""
        self._check_node(node, locked=False)
        for n in self.tree.path_to_root(node):
            if n.device is None:
                raise CacheError(f"cannot lock {n!r}: it is not on device")
        for n in self.tree.path_to_root(node):
            if n.lock_ref == 0:
                self._evictable -= len(n.key)
                self._protected += len(n.key)
                self._leaves.discard(n)
            n.lock_ref += 1

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one ``inc_lock_ref(node)``; CacheError if ``node`` is not locked."""
        self._check_node(node, locked=True)
        for n in self.tree.path_to_root(node):
            n.lock_ref -= 1
            if n.lock_ref == 0:
                self._evictable += len(n.key)
                self._protected -= len(n.key)
                self._refresh_leaf(n)

    # ------------------------------------------------------------ allocation
    def alloc_device(self, num_tokens: int) -> torch.Tensor | None:
        """Device slots for a request (whole pages), evicting if needed; None if
        even eviction cannot make room. The slots are request-held until they
        are inserted or passed to ``free_device``."""
        need = -(-num_tokens // self.page_size) * self.page_size
        alloc = self.device_pool.allocator
        if alloc.available() < need:
            self.evict(need - alloc.available())
        slots = alloc.alloc(need)
        if slots is not None:
            self._request_held += need
        return slots

    def free_device(self, slots: torch.Tensor) -> None:
        """Return request-held slots (whole pages) that never reached the tree."""
        self._free_request_slots(slots)

    def _free_request_slots(self, slots: torch.Tensor) -> None:
        if slots.numel() > self._request_held:
            raise CacheError("freeing more slots than requests hold")
        self.device_pool.allocator.free(slots)
        self._request_held -= slots.numel()

    def _tail_page(self, slot: torch.Tensor) -> torch.Tensor:
        first = int(slot) // self.page_size * self.page_size
        return torch.arange(first, first + self.page_size, dtype=torch.int64)

    # -------------------------------------------------------------- eviction
    def evict(self, num_tokens: int) -> EvictResult:
        """Free at least ``num_tokens`` device tokens if unlocked leaves allow it,
        least recently (or least frequently) used first."""
        heap = [(self._priority(n), n.id, n) for n in self._leaves]
        heapq.heapify(heap)
        freed = deleted = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            freed += len(node.key)
            deleted += len(node.key)
            self._delete_device_leaf(node)
            if parent is not None and parent in self._leaves:
                heapq.heappush(heap, (self._priority(parent), parent.id, parent))
        return EvictResult(freed, 0, deleted)

    def _priority(self, node: TreeNode) -> tuple[int, int]:
        if self._lfu:
            return (node.hit_count, node.last_access)
        return (node.last_access, 0)

    def _delete_device_leaf(self, node: TreeNode) -> None:
        assert node.device is not None and node.lock_ref == 0
        self.device_pool.allocator.free(node.device)
        self._evictable -= len(node.key)
        node.device = None
        self._leaves.discard(node)
        parent = node.parent
        if node.host is None and not node.children:
            self.tree.remove_leaf(node)
        if parent is not None:
            self._refresh_leaf(parent)

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

    # ------------------------------------------------------------- accounting
    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def request_held_size(self) -> int:
        """Device slots handed out by ``alloc_device`` and not yet returned."""
        return self._request_held

    def host_reserved_size(self) -> int:
        """Host slots reserved for prefetches and not yet in the tree."""
        return 0

    def device_tokens(self) -> int:
        return self._evictable + self._protected

    def node_page_keys(self, node: TreeNode) -> list[bytes]:
        """Storage keys of ``node``'s pages, computed once and cached on the node."""
        if node.page_keys is None:
            parent = node.parent
            assert parent is not None
            if parent is self.tree.root:
                parent_key = self.fingerprint
            else:
                parent_key = self.node_page_keys(parent)[-1]
            node.page_keys = page_keys(parent_key, node.namespace, node.key, self.page_size)
        return node.page_keys

    # ---------------------------------------------------------------- admin
    def reset(self) -> None:
        """Drop every cached page. CacheError while any node is locked."""
        if self._protected:
            raise CacheError("cannot reset while requests hold locks")
        for node in list(self.tree.nodes()):
            if node.device is not None:
                self.device_pool.allocator.free(node.device)
                node.device = None
            node.tree = None
        self.tree.root.children.clear()
        self._leaves.clear()
        self._evictable = 0

    def pretty_print(self) -> str:
        """The tree as indented text, one node a line."""
        lines: list[str] = []
        stack = [(c, 1) for c in self.tree.root.children.values()]
        while stack:
            node, depth = stack.pop()
            head = node.key[: min(4, len(node.key))]
            lines.append(f"{'  ' * depth}{node!r} ns={node.namespace!r} key={head}…")
            stack.extend((c, depth + 1) for c in node.children.values())
        return "\n".join(["root", *lines])

    def check_integrity(self) -> None:
        """Assert every invariant of DESIGN §3; AssertionError names the broken one."""
        check_tree(self)

    # --------------------------------------------------------------- checks
    def _check_node(self, node: TreeNode, locked: bool) -> None:
        if not isinstance(node, TreeNode) or node.tree is not self.tree:
            raise CacheError(f"{node!r} is not a live node of this tree")
        if locked and node is not self.tree.root and node.lock_ref <= 0:
            raise CacheError(f"{node!r} is not locked")

    def _check_slots(self, slots: torch.Tensor, n: int) -> None:
        if not isinstance(slots, torch.Tensor) or slots.dtype != torch.int64 or slots.dim() != 1:
            raise ValueError("device_slots must be a 1-D int64 tensor")
        if slots.numel() != n:
            raise ValueError(f"{n} tokens but {slots.numel()} device slots")


def _empty() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64)


def _build_device_pool(config: CacheConfig) -> DeviceKVPool:
    shape = config.model.kv_shape()
    dev = config.device
    tokens = dev.num_tokens or tokens_for_bytes(shape, int(dev.size_gb * (1 << 30)), dev.page_size)
    return DeviceKVPool(shape, tokens, dev.page_size, dev.device)
