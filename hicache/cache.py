"""HiRadixCache: the engine-facing tree_cache that composes tree, pools and tiers."""

from __future__ import annotations

import dataclasses
import heapq
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from device_pool import DeviceKVPool
from hicache.config import CacheConfig
from hicache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventSink,
    Medium,
    ZmqEventPublisher,
)
from hicache.factory import build_device_pool, build_host_pool, build_transfer
from hicache.hashing import model_fingerprint, page_keys
from hicache.integrity import check_tree
from hicache.metrics import CacheMetrics, CacheStats
from hicache.prometheus import Gauges, MetricsServer
from hicache.radix_tree import Key, RadixTree, TreeNode, as_token_list
from hicache.results import (
    EvictResult,
    InsertResult,
    LoadBackResult,
    MatchResult,
    PollResult,
    PrefetchStatus,
    UnfinishedResult,
)
from host_pool import HostKVPool
from storage_backends import StorageBackend, create
from transfer import Completion, TransferEngine, TransferOp
from transfer.storage_io import StorageCompletion, StorageIO, StorageJob

logger = logging.getLogger(__name__)
Tokens = Sequence[int] | torch.Tensor


class _WriteBackOutcome(NamedTuple):
    demoted: int
    deleted: int
    lost: int  # counted as freed while popping, but kept after all


@dataclass
class _Prefetch:
    """A storage prefetch in flight for one request (owner thread only)."""

    request_id: str
    key: Key
    namespace: str | None
    start: int  # tokens before the first fetched page
    keys: list[bytes]
    host_slots: torch.Tensor
    job_id: int
    pin_id: int
    started: float
    fetched: int = 0
    done: bool = False
    released: bool = False


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
        self.metrics = CacheMetrics()
        self.events: EventSink | None = None
        if config.events.endpoint:
            self.events = ZmqEventPublisher(config.events.endpoint, config.events.topic)
        self._metrics_server: MetricsServer | None = None
        if config.metrics.port:
            self._metrics_server = MetricsServer(
                config.metrics.host, config.metrics.port, self.stats, self._gauges
            )
        self._policy = config.policy
        self._evictable = 0
        self._protected = 0
        self._request_held = 0
        self._leaves: set[TreeNode] = set()
        self._backups: dict[int, TreeNode] = {}  # op id -> deepest node being backed up
        self._loads: dict[int, TreeNode] = {}  # op id -> deepest node being loaded
        self._bad_device: set[TreeNode] = set()  # failed loads: device bytes unusable
        self._pins: dict[int, list[TreeNode]] = {}  # pin id -> nodes whose host_ref it holds
        self._next_pin = 0
        self._host_reserved = 0
        self._puts: dict[int, tuple[TreeNode, int]] = {}  # storage job -> (node, pin id)
        self._prefetches: dict[str, _Prefetch] = {}
        self._prefetch_jobs: dict[int, _Prefetch] = {}

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

    # ----------------------------------------------------------------- match
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
        now = self.tree.tick()
        last_device, host_len, device_parts = self.tree.root, 0, []
        last_host = self.tree.root
        for node in walk.path:
            if node in self._bad_device:
                break  # a failed load: neither tier's copy may be used through it
            node.last_access = now
            node.hit_count += 1
            last_host = node
            if node.device is not None:
                last_device = node
                device_parts.append(node.device)
                self._maybe_selective_backup(node)
            else:
                host_len += len(node.key)
        indices = torch.cat(device_parts) if device_parts else _empty()
        stored = 0
        if with_storage and self.storage is not None:
            stored = self._storage_hits(key, last_host, namespace)
        self.metrics.record_match(int(indices.numel()), host_len, stored, len(key))
        return MatchResult(indices, last_device, last_host, host_len, stored)

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
            self.metrics.add("inserted_tokens", len(node.key))
            self._emit_stored(node, "device")
            if self._policy.write_policy == "write_through":
                self._backup(node)
        return InsertResult(prefix_len, node)

    def _absorb(self, node: TreeNode, slots: torch.Tensor) -> None:
        """The request also computed ``node``'s pages: keep one copy. (A node
        whose load failed keeps its unusable copy until it is retired; it is
        never matched meanwhile.)"""
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

    # -------------------------------------------------------------- eviction
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

    # ------------------------------------------------------------- host tier
    def _transfer(self) -> TransferEngine:
        if self.transfer is None:
            raise CacheError("the host tier is disabled")
        return self.transfer

    def _alloc_host(self, num_tokens: int) -> torch.Tensor | None:
        assert self.host_pool is not None
        alloc = self.host_pool.allocator
        if alloc.available() < num_tokens:
            self.evict_host(num_tokens - alloc.available())
        return alloc.alloc(num_tokens)

    def _maybe_selective_backup(self, node: TreeNode) -> None:
        if (
            self._policy.write_policy == "write_through_selective"
            and node.host is None
            and node.backup_op is None
            and node.hit_count >= self._policy.write_through_threshold
        ):
            self._backup(node)

    def _backup(self, node: TreeNode) -> int | None:
        """Start a D2H copy of ``node``; it stays locked until the ack. None
        (and the node stays device-only) when the host tier is off or full."""
        if self.host_pool is None or node.device is None or node.host is not None:
            return None
        host = self._alloc_host(len(node.key))
        if host is None:
            logger.debug("host tier full: %r stays device-only", node)
            return None
        node.host = host
        self.inc_lock_ref(node)
        op = self._transfer().submit(TransferOp("d2h", node.device, host))
        node.backup_op = op
        self._backups[op] = node
        return op

    def init_load_back(self, last_host_node: TreeNode, host_hit_length: int) -> LoadBackResult:
        """Bring the host-only nodes above ``last_host_node`` back to device.

        Allocates device slots (evicting if needed) and queues the H2D copy;
        ``start_loading()`` launches it and ``wait_layer(i)`` gates attention.
        The nodes are locked until the copy lands; lock ``result.last_node``
        for the request as after a match. Loads below
        ``policy.load_back_threshold`` tokens, or that cannot get device slots,
        load nothing (``loaded_tokens == 0``).
        """
        self._check_node(last_host_node, locked=False)
        chain = self._host_chain(last_host_node)
        total = sum(len(n.key) for n in chain)
        anchor = chain[0].parent if chain else last_host_node
        assert anchor is not None
        if total == 0 or total < max(self._policy.load_back_threshold, 1) or host_hit_length <= 0:
            return LoadBackResult(_empty(), anchor, 0)
        slots = self._alloc_for_load(anchor, chain, total)
        if slots is None:
            return LoadBackResult(_empty(), anchor, 0)
        return self._queue_load(chain, slots)

    def _host_chain(self, node: TreeNode) -> list[TreeNode]:
        """Host-only nodes from the first below the device prefix down to ``node``."""
        chain: list[TreeNode] = []
        while node is not self.tree.root and node.device is None:
            chain.append(node)
            assert node.parent is not None
            node = node.parent
        return chain[::-1]

    def _alloc_for_load(
        self, anchor: TreeNode, chain: list[TreeNode], total: int
    ) -> torch.Tensor | None:
        # Pin what we stand on: the device prefix against eviction and the host
        # copies against host eviction, while allocation evicts to make room.
        self.inc_lock_ref(anchor)
        for node in chain:
            node.host_ref += 1
        try:
            return self._alloc_tree_slots(total)
        finally:
            for node in chain:
                node.host_ref -= 1
            self.dec_lock_ref(anchor)

    def _alloc_tree_slots(self, num_tokens: int) -> torch.Tensor | None:
        """Device slots, evicting as needed. Nodes whose backup is in flight are
        locked; when only they stand in the way, wait for their acks and retry
        rather than fail an allocation that is about to become possible."""
        alloc = self.device_pool.allocator
        if alloc.available() < num_tokens:
            self.evict(num_tokens - alloc.available())
        if alloc.available() < num_tokens and self._backups:
            for op in list(self._backups):
                if op in self._backups:
                    self._apply(self._transfer().wait(op))
            self.evict(num_tokens - alloc.available())
        return alloc.alloc(num_tokens)

    def _queue_load(self, chain: list[TreeNode], slots: torch.Tensor) -> LoadBackResult:
        pos = 0
        for node in chain:
            node.device = slots[pos : pos + len(node.key)]
            pos += len(node.key)
            self._add_device_tokens(node)
            self._on_new_device_node(node)
        last = chain[-1]
        self.inc_lock_ref(last)
        hosts = torch.cat([n.host for n in chain if n.host is not None])
        op = self._transfer().submit(TransferOp("h2d", slots, hosts))
        for node in chain:
            node.load_op = op
        self._loads[op] = last
        return LoadBackResult(slots.clone(), last, int(slots.numel()))

    def start_loading(self) -> None:
        """Launch every queued load-back, layer by layer."""
        if self.transfer is not None:
            self.transfer.start_loading()

    def wait_layer(self, layer: int) -> None:
        """Block until layer ``layer`` of the launched loads is on device."""
        if self.transfer is not None:
            self.transfer.wait_layer(layer)

    def poll(self) -> PollResult:
        """Apply finished transfers and storage I/O. Call on every scheduler tick."""
        if self.transfer is None:
            return PollResult(0, 0, 0)
        counts = [0, 0, 0]
        for done in self.transfer.poll():
            counts[self._apply(done)] += 1
        if self.storage is not None:
            for job in self.storage.poll():
                self._apply_storage(job)
        self._retire_bad_device()
        if self.events is not None:
            self.events.flush()
        return PollResult(*counts)

    def drain(self) -> None:
        """Launch queued loads and wait until every transfer and storage job
        has been applied (storage puts started by the backups included)."""
        if self.transfer is None:
            return
        self.transfer.start_loading()
        for op in list(self._backups) + list(self._loads):
            if op in self._backups or op in self._loads:
                self._apply(self.transfer.wait(op))
        if self.storage is not None:
            for job_id in list(self._puts) + list(self._prefetch_jobs):
                if job_id in self._puts or job_id in self._prefetch_jobs:
                    self._apply_storage(self.storage.wait(job_id))
        self.poll()

    def _apply(self, done: Completion) -> int:
        """Apply one completion; returns 0 backup, 1 load, 2 failure."""
        if done.op_id in self._backups:
            return self._finish_backup(self._backups.pop(done.op_id), done)
        if done.op_id in self._loads:
            return self._finish_load(self._loads.pop(done.op_id), done)
        logger.warning("completion for unknown transfer op %d", done.op_id)
        return 2

    def _op_nodes(self, node: TreeNode, attr: str, op: int) -> list[TreeNode]:
        """``node`` and the ancestors split off it that share transfer ``op``."""
        nodes = []
        cur: TreeNode | None = node
        while cur is not None and cur is not self.tree.root and getattr(cur, attr) == op:
            nodes.append(cur)
            cur = cur.parent
        return nodes

    def _finish_backup(self, node: TreeNode, done: Completion) -> int:
        self.metrics.record_transfer("d2h", done.nbytes, done.ok)
        nodes = self._op_nodes(node, "backup_op", done.op_id)
        for n in nodes:
            n.backup_op = None
            if not done.ok and n.host is not None:
                assert self.host_pool is not None
                self.host_pool.allocator.free(n.host)
                n.host = None
        self.dec_lock_ref(node)
        if not done.ok:
            logger.warning("backup of %r failed: %s", node, done.error)
            return 2
        for n in nodes:
            self._emit_stored(n, "host")
            self._store(n)
        return 0

    def _finish_load(self, node: TreeNode, done: Completion) -> int:
        self.metrics.record_transfer("h2d", done.nbytes, done.ok)
        nodes = self._op_nodes(node, "load_op", done.op_id)
        for n in nodes:
            n.load_op = None
            if done.ok:
                self._emit_stored(n, "device")
        if not done.ok:
            logger.warning("load-back of %r failed: %s", node, done.error)
            self._bad_device.update(nodes)
        self.dec_lock_ref(node)
        return 1 if done.ok else 2

    def _retire_bad_device(self) -> None:
        """Drop device copies from failed loads once nobody holds them."""
        self._bad_device = {n for n in self._bad_device if n.tree is self.tree}
        depth = {n: sum(1 for _ in self.tree.path_to_root(n)) for n in self._bad_device}
        for node in sorted(self._bad_device, key=lambda n: -depth[n]):
            if node.lock_ref == 0 and not node.has_device_child():
                self._drop_device(node)

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

    # ----------------------------------------------------------------- pins
    def _pin(self, nodes: list[TreeNode]) -> int:
        """Keep the host copies of ``nodes`` (host_ref) until ``_unpin``."""
        self._next_pin += 1
        for node in nodes:
            node.host_ref += 1
        self._pins[self._next_pin] = list(nodes)
        return self._next_pin

    def _unpin(self, pin_id: int) -> None:
        for node in self._pins.pop(pin_id):
            node.host_ref -= 1

    def _on_split(self, upper: TreeNode, lower: TreeNode) -> None:
        # A pin on ``lower`` covered pages that now live partly in ``upper``.
        if lower.host_ref:
            for nodes in self._pins.values():
                if lower in nodes:
                    nodes.append(upper)

    # --------------------------------------------------------------- storage
    def _store(self, node: TreeNode) -> None:
        """Write ``node``'s (just backed-up) host pages to storage, async."""
        if self.storage is None or node.host is None:
            return
        keys = tuple(self.node_page_keys(node))
        job = self.storage.submit(StorageJob("put", keys, node.host))
        self._puts[job] = (node, self._pin([node]))

    def _parent_key(self, node: TreeNode) -> bytes:
        return self.fingerprint if node is self.tree.root else self.node_page_keys(node)[-1]

    def _depth_tokens(self, node: TreeNode) -> int:
        return sum(len(n.key) for n in self.tree.path_to_root(node))

    def _storage_hits(self, key: Key, last: TreeNode, namespace: str | None) -> int:
        assert self.storage is not None
        start = self._depth_tokens(last)
        keys = page_keys(self._parent_key(last), namespace, key[start:], self.page_size)
        return self.storage.backend.exists(keys) * self.page_size if keys else 0

    def prefetch(
        self,
        request_id: str,
        tokens: Tokens,
        namespace: str | None,
        last_host_node: TreeNode,
    ) -> int:
        """Fetch the pages of ``tokens`` past ``last_host_node`` that storage
        holds into reserved host slots, asynchronously; on completion they are
        inserted as host-only nodes. Returns the tokens being fetched (0 when
        fewer than ``policy.prefetch_threshold`` are available, or no room).
        CacheError if ``request_id`` already has a prefetch."""
        if self.storage is None:
            return 0
        if request_id in self._prefetches:
            raise CacheError(f"request {request_id!r} already has a prefetch")
        key = as_token_list(tokens)
        self._check_node(last_host_node, locked=False)
        start = self._depth_tokens(last_host_node)
        aligned = len(key) // self.page_size * self.page_size
        if start >= aligned:
            return 0
        parent_key = self._parent_key(last_host_node)
        keys = page_keys(parent_key, namespace, key[start:aligned], self.page_size)
        hits = self.storage.backend.exists(keys) * self.page_size
        if hits == 0 or hits < self._policy.prefetch_threshold:
            if hits:
                self.metrics.add("prefetch_below_threshold")
            return 0
        self.metrics.add("prefetch_started")
        return self._start_prefetch(request_id, key, namespace, last_host_node, keys, hits)

    def _start_prefetch(
        self,
        request_id: str,
        key: Key,
        namespace: str | None,
        last: TreeNode,
        keys: list[bytes],
        hits: int,
    ) -> int:
        assert self.storage is not None
        pin = self._pin(self._host_chain(last))  # the prefix the pages hang from
        slots = self._alloc_host(hits)
        if slots is None:
            self._unpin(pin)
            return 0
        self._host_reserved += hits
        n_pages = hits // self.page_size
        job = self.storage.submit(StorageJob("get", tuple(keys[:n_pages]), slots))
        start = self._depth_tokens(last)
        state = _Prefetch(
            request_id, key, namespace, start, keys[:n_pages], slots, job, pin, time.monotonic()
        )
        self._prefetches[request_id] = state
        self._prefetch_jobs[job] = state
        return hits

    def check_prefetch(self, request_id: str) -> PrefetchStatus:
        """Progress of ``request_id``'s prefetch and whether the request may
        proceed under ``policy.prefetch_policy``. CacheError if unknown."""
        state = self._prefetches.get(request_id)
        if state is None:
            raise CacheError(f"no prefetch for request {request_id!r}")
        if not state.done and self.storage is not None:
            for job in self.storage.poll():
                self._apply_storage(job)
        total = len(state.keys) * self.page_size
        policy = self._policy.prefetch_policy
        if policy == "best_effort":
            ready = True
        elif policy == "wait_complete":
            ready = state.done
        else:
            budget = self._policy.prefetch_timeout_base_s + (
                self._policy.prefetch_timeout_per_1k_s * total / 1000
            )
            ready = state.done or time.monotonic() - state.started >= budget
        return PrefetchStatus(ready, state.done, state.fetched, total)

    def wait_prefetch(self, request_id: str) -> PrefetchStatus:
        """Block until ``request_id``'s prefetch has landed and been inserted."""
        state = self._prefetches.get(request_id)
        if state is None:
            raise CacheError(f"no prefetch for request {request_id!r}")
        if self.storage is not None and state.job_id in self._prefetch_jobs:
            self._apply_storage(self.storage.wait(state.job_id))
        return self.check_prefetch(request_id)

    def release_prefetch(self, request_id: str) -> None:
        """The request no longer waits on its prefetch; a fetch still running
        is inserted when it lands. CacheError if unknown."""
        state = self._prefetches.pop(request_id, None)
        if state is None:
            raise CacheError(f"no prefetch for request {request_id!r}")
        state.released = True

    def _apply_storage(self, done: StorageCompletion) -> None:
        if done.job_id in self._puts:
            node, pin = self._puts.pop(done.job_id)
            self._unpin(pin)
            ok = done.error is None and all(done.results)
            self.metrics.record_transfer("h2s", done.nbytes, ok)
            if not ok:
                logger.debug("storage put %d incomplete: %s", done.job_id, done.error)
            if any(done.results):
                self._emit_stored(node, "storage", done.results)
            return
        state = self._prefetch_jobs.pop(done.job_id, None)
        if state is None:
            logger.warning("completion for unknown storage job %d", done.job_id)
            return
        self._finish_prefetch(state, done)

    def _finish_prefetch(self, state: _Prefetch, done: StorageCompletion) -> None:
        assert self.host_pool is not None
        got = done.leading_hits * self.page_size
        self.metrics.record_transfer("s2h", done.nbytes, done.error is None)
        outcome = "complete" if got == state.host_slots.numel() else "partial" if got else "failed"
        self.metrics.add(f"prefetch_{outcome}")
        self._host_reserved -= state.host_slots.numel()
        if got < state.host_slots.numel():
            self.host_pool.allocator.free(state.host_slots[got:])
        self._insert_host(state, state.host_slots[:got])
        self._unpin(state.pin_id)
        state.fetched, state.done = got, True

    def _insert_host(self, state: _Prefetch, slots: torch.Tensor) -> None:
        """Insert fetched pages as host-only nodes below what the tree holds."""
        assert self.host_pool is not None
        end = state.start + slots.numel()
        walk = self.tree.walk(state.key[:end], state.namespace, split=True)
        have = walk.length - state.start  # fetched tokens the tree already holds
        if have < 0:  # the prefix they hang from is gone: nothing to attach to
            self.host_pool.allocator.free(slots)
            return
        if have:
            self.host_pool.allocator.free(slots[:have])
        if walk.length < end:
            node = self.tree.add_child(walk.node, state.key[walk.length : end], state.namespace)
            node.host = slots[have:].clone()
            ps = self.page_size
            node.page_keys = state.keys[have // ps : slots.numel() // ps]
            node.last_access = self.tree.tick()
            self._emit_stored(node, "host")

    # ------------------------------------------------------- events, metrics
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
        return self._host_reserved

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
