"""HiRadixCache: the engine-facing tree_cache that composes tree, pools and tiers.

The class is assembled from one mixin per concern (eviction, host tier,
storage tier, observability), each in its own module over the shared state
declared in ``cache_state``; this module holds construction, match, insert,
locks, allocation and administration.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from device_pool import DeviceKVPool
from hicache.cache_state import CacheError, PrefetchState, empty_slots
from hicache.config import CacheConfig
from hicache.events import (
    AllBlocksCleared,
    BlockStored,
    EventSink,
    ZmqEventPublisher,
)
from hicache.eviction import EvictionMixin
from hicache.factory import build_device_pool, build_host_pool, build_transfer
from hicache.hashing import model_fingerprint, page_keys
from hicache.host_tier import HostTierMixin
from hicache.integrity import check_tree
from hicache.metrics import CacheMetrics
from hicache.observability import ObservabilityMixin
from hicache.prometheus import MetricsServer
from hicache.radix_tree import Key, RadixTree, Tokens, TreeNode, as_token_list
from hicache.results import (
    InsertResult,
    MatchResult,
    UnfinishedResult,
)
from hicache.storage_tier import StorageTierMixin
from host_pool import HostKVPool
from storage_backends import StorageBackend, create
from transfer import TransferEngine
from transfer.storage_io import StorageIO

logger = logging.getLogger(__name__)


class HiRadixCache(EvictionMixin, HostTierMixin, StorageTierMixin, ObservabilityMixin):
    """Radix cache of KV pages across device, host and storage tiers.

    Threading: one owner thread (the engine's scheduler) calls every method;
    it is the only one that mutates the tree and the allocators. Background
    transfer and storage workers report completions that ``poll()`` applies.
    Errors: bad input raises ``ValueError`` (``CacheError`` for misuse of
    nodes, locks and slots) before anything is changed.
    """

    def __init__(
        self,
        config: CacheConfig,
        device_pool: DeviceKVPool | None = None,
        host_pool: HostKVPool | None = None,
        transfer: TransferEngine | None = None,
        storage: StorageBackend | None = None,
    ) -> None:
        """Pools, the transfer engine and the storage backend are built from
        ``config`` unless given (an engine passes its own device pool; tests
        pass a fault-injecting transfer engine)."""
        self.config = config
        self.page_size = config.device.page_size
        self.device_pool = device_pool or build_device_pool(config)
        if self.device_pool.page_size != self.page_size:
            raise ValueError("device pool page_size differs from device.page_size")
        self.host_pool = host_pool or build_host_pool(config, self.device_pool)
        self.transfer: TransferEngine | None = None
        if self.host_pool is not None:
            self.transfer = transfer or build_transfer(config, self.device_pool, self.host_pool)
        self.tree = RadixTree(self.page_size, on_split=self._on_split)
        self.fingerprint = model_fingerprint(config.model, self.page_size)
        self.storage = self._build_storage(storage)
        self._init_observability(config)
        # The rest is described, attribute by attribute, in CacheState.
        self._policy = config.policy
        self._evictable = 0
        self._protected = 0
        self._request_held = 0
        self._leaves: set[TreeNode] = set()
        self._backups: dict[int, TreeNode] = {}
        self._loads: dict[int, TreeNode] = {}
        self._queued_loads: set[int] = set()
        self._launched_early: set[int] = set()
        self._batch_loads: set[int] = set()
        self._failed_loads: set[int] = set()
        self._bad_device: set[TreeNode] = set()
        self._pins: dict[int, list[TreeNode]] = {}
        self._next_pin = 0
        self._puts: dict[int, tuple[int, BlockStored | None]] = {}
        self._prefetches: dict[str, PrefetchState] = {}
        self._prefetch_jobs: dict[int, PrefetchState] = {}

    def _init_observability(self, config: CacheConfig) -> None:
        self.metrics = CacheMetrics()
        self.events: EventSink | None = None
        if config.events.endpoint:
            self.events = ZmqEventPublisher.from_config(config.events, config.storage.backend)
        self._metrics_server: MetricsServer | None = None
        if config.metrics.port:
            self._metrics_server = MetricsServer(
                config.metrics.host,
                config.metrics.port,
                self.stats,
                self._gauges,
                self.metrics.histograms,
            )

    def _on_split(self, upper: TreeNode, lower: TreeNode) -> None:
        """Keep bookkeeping kept outside the nodes true when ``lower`` loses
        its first pages to the new ``upper`` (backup/load op ids and locks are
        copied by the tree itself)."""
        # Both halves of a failed load's node are unusable on device.
        if lower in self._bad_device:
            self._bad_device.add(upper)
        # A pin on ``lower`` covered pages that now live partly in ``upper``.
        if lower.host_ref:
            for nodes in self._pins.values():
                if lower in nodes:
                    nodes.append(upper)

    def _build_storage(self, backend: StorageBackend | None) -> StorageIO | None:
        cfg = self.config.storage
        if backend is None and not cfg.enabled:
            return None
        if self.host_pool is None:
            raise ValueError("the storage tier needs the host tier")
        if backend is None:
            named = dataclasses.replace(cfg, fingerprint=self.fingerprint.hex())
            backend = create(cfg.backend, named)
        return StorageIO(backend, self.host_pool, self.config.policy.io_workers)

    def match_prefix(
        self, tokens: Tokens, namespace: str | None = None, with_storage: bool = False
    ) -> MatchResult:
        """Longest cached page-aligned prefix of ``tokens``; splits a node when
        the match ends inside it and refreshes LRU/LFU state along the path.
        With ``with_storage`` (and a storage tier), also counts the tokens past
        the host match that storage holds."""
        key = as_token_list(tokens)
        key = key[: len(key) // self.page_size * self.page_size]
        walk = self.tree.walk(key, namespace, split=True)
        self._settle_loads(walk.path)
        now = self.tree.tick()
        last_device, host_len, device_parts = self.tree.root, 0, []
        last_host, to_back_up = self.tree.root, []
        for node in walk.path:
            if node in self._bad_device:
                break  # a failed load: neither tier's copy may be used through it
            node.last_access = now
            node.hit_count += 1
            last_host = node
            if node.device is not None:
                last_device = node
                device_parts.append(node.device)
                to_back_up.append(node)
            else:
                host_len += len(node.key)
        indices = torch.cat(device_parts) if device_parts else empty_slots()
        self._selective_backups(to_back_up, walk.path)
        stored = 0
        if with_storage and self.storage is not None:
            stored = self._storage_hits(key, last_host, namespace)
        self.metrics.record_match(int(indices.numel()), host_len, stored, len(key))
        return MatchResult(indices, last_device, last_host, host_len, stored)

    def insert(
        self, tokens: Tokens, device_slots: torch.Tensor, namespace: str | None = None
    ) -> InsertResult:
        """Cache the whole pages of ``tokens`` whose KV is at ``device_slots``.

        Call only after the forward pass has written that KV. The slots are
        the request's; pages the tree already holds keep the tree's slots and
        the request's duplicates are freed; new pages pass to the tree. Slots
        past ``result.inserted_len`` stay the caller's.
        """
        key = as_token_list(tokens)
        self._check_slots(device_slots, len(key))
        aligned = len(key) // self.page_size * self.page_size
        return self._insert(key[:aligned], device_slots[:aligned], namespace)

    def _insert(
        self, key: Key, slots: torch.Tensor, ns: str | None, finished: bool = False
    ) -> InsertResult:
        walk = self.tree.walk(key, ns, split=True)
        pos, now, node = 0, self.tree.tick(), self.tree.root
        for i, step in enumerate(walk.path):
            if step in self._bad_device:
                # Its device copy is unusable and still held: keep the request's
                # own KV from here on rather than trade it for garbage.
                if finished:
                    self._free_own(walk.path[i:], slots[pos:])
                return InsertResult(walk.length, node, pos)
            node = step
            node.last_access = now
            self._absorb(node, slots[pos : pos + len(node.key)])
            pos += len(node.key)
        prefix_len = walk.length
        if pos < len(key):
            node = self.tree.add_child(node, key[pos:], ns)
            node.last_access = now
            node.device = slots[pos:].clone()
            self._request_held -= len(node.key)
            self._evictable += len(node.key)
            self._on_new_device_node(node)
            self.metrics.add("inserted_tokens", len(node.key))
            self._emit_stored(node, "device")
            if self._policy.write_policy == "write_through":
                self._backup(node)
        return InsertResult(prefix_len, node, len(key))

    def _free_own(self, nodes: list[TreeNode], slots: torch.Tensor) -> None:
        """Free a finished request's slots that ``nodes`` (consecutive, from
        where its insert stopped) do not hold."""
        own, pos = [], 0
        for node in nodes:
            part = slots[pos : pos + len(node.key)]
            own.append(part if node.device is None else part[node.device != part])
            pos += len(node.key)
        own.append(slots[pos:])
        self._free_request_slots(torch.cat(own))

    def _absorb(self, node: TreeNode, slots: torch.Tensor) -> None:
        """The request also computed ``node``'s pages: keep one copy."""
        if node.device is None:
            node.device = slots.clone()  # revive a host-only node with the fresh KV
            self._request_held -= len(slots)
            self._add_device_tokens(node)
            self._on_new_device_node(node)
            self._emit_stored(node, "device")
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
        result = self._insert(key[:aligned], device_slots[:aligned], namespace, finished=True)
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
        Use ``result.device_indices`` for the first positions from now on; the
        slots after them (the partial tail page, or more when the insert
        stopped at a failed load, see ``InsertResult``) stay the request's."""
        key = as_token_list(tokens)
        self._check_slots(device_slots, len(key))
        self._check_node(last_node, locked=True)
        aligned = len(key) // self.page_size * self.page_size
        result = self._insert(key[:aligned], device_slots[:aligned], namespace)
        self.inc_lock_ref(result.last_node)
        self.dec_lock_ref(last_node)
        parts = [n.device for n in reversed(list(self.tree.path_to_root(result.last_node)))]
        indices = torch.cat(parts) if parts else empty_slots()
        return UnfinishedResult(indices, result.last_node, result.prefix_len)

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

    def alloc_device(self, num_tokens: int) -> torch.Tensor | None:
        """Device slots for a request (whole pages), evicting if needed; None if
        even eviction cannot make room. The slots are request-held until they
        are inserted or passed to ``free_device``."""
        need = -(-num_tokens // self.page_size) * self.page_size
        slots = self._alloc_tree_slots(need)
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

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def request_held_size(self) -> int:
        """Device slots handed out by ``alloc_device`` and not yet returned."""
        return self._request_held

    def host_reserved_size(self) -> int:
        """Host slots reserved for prefetches and not yet in the tree."""
        return sum(p.host_slots.numel() for p in self._prefetch_jobs.values())

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

    def reset(self) -> None:
        """Drop every cached page in the device and host tiers (storage keeps
        its pages). Waits for transfers in flight first; CacheError (nothing
        dropped) while requests hold locks or prefetches are registered."""
        self.drain()
        if self._protected or self._prefetches:
            raise CacheError("cannot reset while requests hold locks")
        for node in list(self.tree.nodes()):
            if node.device is not None:
                self.device_pool.allocator.free(node.device)
                node.device = None
            if node.host is not None and self.host_pool is not None:
                self.host_pool.allocator.free(node.host)
                node.host = None
            node.tree = None
        self.tree.root.children.clear()
        self._leaves.clear()
        self._bad_device.clear()
        self._evictable = 0
        if self.events is not None:
            self.events.emit(AllBlocksCleared())
            self.events.flush()

    def close(self) -> None:
        """Wait for transfers and storage writes in flight, then stop the
        workers and close the storage backend. Idempotent."""
        if self.transfer is not None:
            self.drain()
            self.transfer.close()
            self.transfer = None
        if self.storage is not None:
            self.storage.close()
            self.storage = None
        if self.events is not None:
            self.events.close()
            self.events = None
        if self._metrics_server is not None:
            self._metrics_server.close()
            self._metrics_server = None

    def __enter__(self) -> HiRadixCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
