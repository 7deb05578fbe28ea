"""HiRadixCache: the engine-facing tree_cache, a façade over parts it owns.

- ``residency`` (``ResidencyTree``): the tree, locks, device copies and accounting;
- ``host`` (``HostTier``): host copies, backups, load-backs, host eviction;
- ``store`` (``StorageTier``): storage I/O, puts, prefetches, lookups, removals;
- ``observer`` (``Observer``): KV events and metrics.

Parts never call each other: they return typed records (``records.py``) and
this module routes each one to the parts it concerns.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Sequence

import numpy as np
import torch

from device_pool import DeviceKVPool
from hicache.config.cache import CacheConfig
from hicache.events.kv import EventSink
from hicache.factory import build_device_pool, build_host_pool, build_transfer
from hicache.keys.hashing import NodeKeys, model_fingerprint, page_keys
from hicache.lifecycle import Lifecycle
from hicache.observe.metrics import CacheMetrics, CacheStats
from hicache.observe.observer import Observer
from hicache.observe.prometheus import Gauges
from hicache.policies.eviction import create_eviction_policy
from hicache.policies.prefetch import StoragePlan, create_prefetch_policy
from hicache.policies.prefetch_cost import CostSettings, PrefixParts
from hicache.policies.rates import Clock, RatesSnapshot
from hicache.policies.write import create_write_policy
from hicache.tiers.host import HostTier
from hicache.tiers.records import (
    BackupDone,
    Dropped,
    LoadDone,
    LoadFailed,
    LookupDone,
    PrefetchDone,
    PrefetchState,
    PutDone,
    StorageRemoved,
    WaitTimedOut,
)
from hicache.tiers.residency import NO_SLOTS, ResidencyTree
from hicache.tiers.results import (
    AdmitResult,
    DeviceShortfall,
    EvictResult,
    InsertResult,
    LoadBackResult,
    MatchResult,
    PollResult,
    PrefetchStatus,
    UnfinishedResult,
)
from hicache.tiers.storage import StorageTier, prefetch_outcome
from hicache.tree.door import (
    InsertArgs,
    check_count,
    check_insert,
    check_namespace,
    check_on_path,
    check_request_id,
)
from hicache.tree.errors import CacheError
from hicache.tree.integrity import check_tree
from hicache.tree.paging import align_down, align_up, empty_slots
from hicache.tree.radix_tree import RadixTree, Tokens, TreeNode, as_token_list
from host_pool import HostKVPool
from storage_backends import StorageBackend
from storage_backends.guard import GuardedBackend, open_guarded
from transfer import TransferEngine
from transfer.storage_io import StorageIO

__all__ = ["CacheError", "HiRadixCache"]

logger = logging.getLogger(__name__)

Record = (
    BackupDone
    | LoadDone
    | LoadFailed
    | PutDone
    | PrefetchDone
    | LookupDone
    | StorageRemoved
    | WaitTimedOut
)


class HiRadixCache:
    """Radix cache of KV pages across device, host and storage tiers.

    Threading: one owner thread (the engine's scheduler) calls every method;
    it is the only one that mutates the tree and the allocators. Background
    transfer and storage workers report completions that ``poll()`` applies;
    no storage backend call runs on the owner thread.
    Errors: bad input raises ``ValueError`` (``CacheError`` for misuse of
    nodes, locks and slots, ``SlotError`` for slots) before anything changes.
    """

    def __init__(
        self,
        config: CacheConfig,
        device_pool: DeviceKVPool | None = None,
        host_pool: HostKVPool | None = None,
        transfer: TransferEngine | None = None,
        storage: StorageBackend | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        """Pools, the transfer engine and the storage backend are built from
        ``config`` unless given (an engine passes its own device pool; tests
        pass a fault-injecting transfer engine, and a fake ``clock`` for the
        prefetch budgets, deadlines and measured rates). A constructor that
        fails releases everything it started (worker threads, sockets, the store)."""
        self._life = Lifecycle(self)
        self._clock = clock
        try:
            self._build(config, device_pool, host_pool, transfer, storage)
        except BaseException:
            self._life.release()
            # The parts refer back to this object (callbacks): drop them now so
            # that the pools go with the exception, not at the next GC cycle.
            vars(self).clear()
            raise

    def _build(
        self,
        config: CacheConfig,
        device_pool: DeviceKVPool | None,
        host_pool: HostKVPool | None,
        transfer: TransferEngine | None,
        storage: StorageBackend | None,
    ) -> None:
        self.config = config
        self.page_size = ps = config.device.page_size
        self.device_pool = device_pool or build_device_pool(config)
        if self.device_pool.page_size != ps:
            raise ValueError("device pool page_size differs from device.page_size")
        self.host_pool = host_pool or build_host_pool(config, self.device_pool)
        if host_pool is None and self.host_pool is not None:
            # Built here, so ours to unpin; released last (after the copy engine).
            self._life.started(self.host_pool.close)
        self.fingerprint = model_fingerprint(config.model, ps)
        self.keys = NodeKeys(self.fingerprint, ps)
        self._write = create_write_policy(config.policy.write_policy)
        self._prefetch = create_prefetch_policy(config.policy.prefetch_policy)
        self._cost = CostSettings(config.policy.cost_margin, config.policy.cost_probe_s)
        evict_policy = create_eviction_policy(config.policy.eviction)
        self.residency = ResidencyTree(ps, self.device_pool.allocator, evict_policy, self._on_split)
        self.host: HostTier | None = None
        if self.host_pool is not None:
            engine = transfer or build_transfer(config, self.device_pool, self.host_pool)
            self._life.started(engine.close)
            self.host = HostTier(self.host_pool, engine, self.residency.tree, evict_policy)
            self._life.started(self.host.close)
        self.store = self._build_storage(storage)
        self.observer = Observer(config, self.keys, self._gauges, self._clock)
        self._life.started(self.observer.close)

    def _build_storage(self, backend: StorageBackend | None) -> StorageTier | None:
        cfg = self.config.storage
        if backend is None and not cfg.enabled:
            return None
        if self.host_pool is None:
            raise ValueError("the storage tier needs the host tier")
        # Behind the guard, a failing or damaged store costs hits, never the engine.
        if backend is None:
            named = dataclasses.replace(cfg, fingerprint=self.fingerprint.hex())
            guarded = open_guarded(cfg.backend, named)
        else:
            guarded = GuardedBackend(backend, None, cfg.timeout_s)
        io = StorageIO(guarded, self.host_pool, self.config.policy.io_workers, self._clock)
        self._life.started(functools.partial(io.close, cfg.timeout_s))
        return StorageTier(io, self.page_size, cfg.timeout_s, self._clock)

    def _on_split(self, upper: TreeNode, lower: TreeNode) -> None:
        if self.host is not None:
            self.host.on_split(upper, lower)

    # views kept for callers ------------------------------------------------
    @property
    def tree(self) -> RadixTree:
        return self.residency.tree

    @property
    def transfer(self) -> TransferEngine | None:
        return None if self.host is None else self.host.transfer

    @property
    def storage(self) -> StorageIO | None:
        return None if self.store is None else self.store.io

    @property
    def metrics(self) -> CacheMetrics:
        return self.observer.metrics

    @property
    def events(self) -> EventSink | None:
        """The KV event publisher (None when ``events.endpoint`` is empty); its
        ``endpoint`` is the address it bound, the port resolved when the config
        said ``*`` (also logged at INFO)."""
        return self.observer.events

    # match and insert ---------------------------------------------------------
    def match_prefix(
        self, tokens: Tokens, namespace: str | None = None, with_storage: bool = False
    ) -> MatchResult:
        """Longest cached page-aligned prefix of ``tokens``; splits a node when
        the match ends inside it and refreshes LRU/LFU state along the path.
        ``result.key`` is ``tokens`` converted and checked (a ``TokenKey``):
        pass it, or ``extend_key(result.key, generated)``, to ``cache_*_req``
        and later matches, and its ids are not checked again.
        With ``with_storage``, ``storage_hit_length`` is what the last
        completed storage lookup of the pages past the host match found; when
        none completed yet it is 0 and a lookup starts on the I/O workers (the
        backend is never called here)."""
        check_namespace(namespace)
        key = as_token_list(tokens)
        whole = align_down(len(key), self.page_size)
        aligned = key if whole == len(key) else key[:whole]  # no copy when aligned
        path = self.residency.walk(aligned, namespace)
        if self.host is not None and any(n.load_op is not None for n in path):
            self._route(self.host.settle(path))
        found = self.residency.touch(path)
        indices = found.device_indices
        self._selective_backups(found.device_nodes, path)
        stored = 0
        if with_storage and self.store is not None:
            start = self.residency.depth_tokens(found.last_host)
            tail = page_keys(
                self.keys.chain_from(found.last_host), namespace, aligned[start:], self.page_size
            )
            stored = self.store.known_hits(tail) * self.page_size
        self.observer.metrics.record_match(
            int(indices.numel()), found.host_len, stored, len(aligned)
        )
        return MatchResult(indices, found.last_device, found.last_host, found.host_len, stored, key)

    def insert(
        self,
        tokens: Tokens,
        device_slots: torch.Tensor,
        namespace: str | None = None,
        *,
        priority: int = 0,
    ) -> InsertResult:
        """Cache the whole pages of ``tokens`` whose KV is at ``device_slots``.

        Call only after the forward pass has written that KV. Slots that are
        not the tree's own must be request-held (SlotError otherwise). Pages
        the tree already holds keep the tree's slots and the request's
        duplicates are freed; new pages pass to the tree. Slots past
        ``result.inserted_len`` stay the caller's."""
        door = self._door(tokens, device_slots, namespace)
        return self._insert(door, namespace, NO_SLOTS, False, priority)

    def cache_finished_req(
        self,
        tokens: Tokens,
        device_slots: torch.Tensor,
        last_node: TreeNode,
        namespace: str | None = None,
        *,
        priority: int = 0,
    ) -> InsertResult:
        """A request is done: insert its KV, free its duplicates and its partial
        tail page, and drop the lock it held on ``last_node`` (from its match).
        The slots past ``last_node`` must be the request's own (SlotError: a
        request finished twice, or another's KV)."""
        door = self._door(tokens, device_slots, namespace, last_node)
        result = self._insert(door, namespace, door.tail, True, priority)
        self.residency.unlock(last_node)
        return result

    def cache_unfinished_req(
        self,
        tokens: Tokens,
        device_slots: torch.Tensor,
        last_node: TreeNode,
        namespace: str | None = None,
        *,
        priority: int = 0,
    ) -> UnfinishedResult:
        """Mid-request: insert what is computed so far and move the request's
        lock from ``last_node`` to the new last node. Use
        ``result.device_indices`` for the first positions from now on; the
        slots after them stay the request's."""
        door = self._door(tokens, device_slots, namespace, last_node)
        result = self._insert(door, namespace, NO_SLOTS, False, priority)
        self.residency.lock(result.last_node)
        self.residency.unlock(last_node)
        indices = self.residency.prefix_slots(result.last_node)
        return UnfinishedResult(indices, result.last_node, result.prefix_len)

    def _door(
        self, tokens: Tokens, slots: torch.Tensor, ns: str | None, last: TreeNode | None = None
    ) -> InsertArgs:
        if last is not None:
            self.residency.check_node(last, locked=True)
        page_of = self.device_pool.allocator.page_slots
        return check_insert(self.tree, tokens, slots, ns, last, page_of)

    def _insert(
        self,
        door: InsertArgs,
        ns: str | None,
        tail: np.ndarray,
        finished: bool,
        priority: int,
    ) -> InsertResult:
        key, aligned, slots = door.key, door.aligned, door.slots
        if aligned < len(key):
            key, slots = key[:aligned], slots[:aligned]
        out = self.residency.insert(
            key, slots, ns, tail, finished, priority, door.own_from, door.last_node
        )
        for node in out.new_device:
            self.observer.stored(node, "device")
        if out.added is not None:
            self.observer.metrics.add("inserted_tokens", len(out.added.key))
            if self._write.on_insert:
                self._backup(out.added)
        return out.result

    # locks and device slots ------------------------------------------------
    def inc_lock_ref(self, node: TreeNode) -> None:
        """Pin ``node`` and its ancestors on device (they will not be evicted)."""
        self.residency.lock(node)

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one ``inc_lock_ref(node)``; CacheError if ``node`` is not locked."""
        self.residency.unlock(node)

    def alloc_device(self, num_tokens: int) -> torch.Tensor | None:
        """Device slots for a request (whole pages), evicting if needed; None if
        even eviction cannot make room. The slots are request-held until they
        are inserted or passed to ``free_device``."""
        check_count(num_tokens, "num_tokens")
        return self._alloc_device(align_up(num_tokens, self.page_size))

    def _alloc_device(self, num_tokens: int) -> torch.Tensor | None:
        """Evict as needed; when only backups in flight (locked) stand in the
        way, wait for their acks and retry rather than fail."""
        alloc = self.device_pool.allocator
        if alloc.available() < num_tokens:
            self.evict(num_tokens - alloc.available())
        short = alloc.available() < num_tokens
        if short and self.host is not None and self.host.backups_in_flight():
            self._route(self.host.wait_backups())
            self.evict(num_tokens - alloc.available())
        slots = alloc.alloc(num_tokens)
        if slots is None:
            logger.info("device allocation failed: %s", self.device_shortfall(num_tokens))
        return slots

    def device_shortfall(self, num_tokens: int) -> DeviceShortfall:
        """Why ``num_tokens`` device tokens cannot be had now: what holds the
        device pool. Read-only; for error messages."""
        return self.residency.shortfall(align_up(num_tokens, self.page_size))

    def free_device(self, slots: torch.Tensor) -> None:
        """Return request-held slots (whole pages) that never reached the tree;
        SlotError (nothing freed) for any other slot."""
        self.device_pool.allocator.free_request(slots)

    def evictable_size(self) -> int:
        return self.residency.evictable_size()

    def protected_size(self) -> int:
        return self.residency.protected_size()

    def request_held_size(self) -> int:
        """Device slots handed out by ``alloc_device`` and not yet returned."""
        return self.device_pool.allocator.request_held()

    def host_reserved_size(self) -> int:
        """Host slots reserved for prefetches and not yet in the tree."""
        return 0 if self.store is None else self.store.reserved()

    def device_tokens(self) -> int:
        return self.residency.device_tokens()

    def node_page_keys(self, node: TreeNode) -> list[bytes]:
        """Storage keys of ``node``'s pages, computed once and kept on the node."""
        return self.keys.of(node)

    # eviction ----------------------------------------------------------------
    def evict(self, num_tokens: int) -> EvictResult:
        """Free at least ``num_tokens`` device tokens if unlocked leaves allow it,
        by the eviction policy. A leaf with a host copy is demoted (stays,
        host-only); a leaf the write policy (or host-only children) wants kept
        is backed up first, waiting for the copy; otherwise it is deleted.
        When the host tier has no room for such a backup because storage
        writes in flight pin its pages, waits for them once (at most
        ``storage.timeout_s``)."""
        check_count(num_tokens, "num_tokens")
        freed = demoted = deleted = 0
        waited = [False]  # one wait for storage per call keeps the call bounded
        while freed < num_tokens:
            step = self.residency.evict_pass(num_tokens - freed, self._needs_write_back)
            dropped = list(step.dropped)
            lost = 0
            for node in step.write_back:
                done = self._write_back(node, waited)
                lost += 0 if done is not None else len(node.key)
                dropped += [done] if done is not None else []
            self._route_dropped(dropped, "device")
            if step.freed - lost == 0:
                break
            freed += step.freed - lost
            demoted += sum(len(d.node.key) for d in dropped if not d.deleted)
            deleted += sum(len(d.node.key) for d in dropped if d.deleted)
        return EvictResult(freed, demoted, deleted)

    def _needs_write_back(self, node: TreeNode) -> bool:
        # Host-only children would be orphaned by deleting their parent.
        return self.host is not None and (self._write.on_evict or bool(node.children))

    def _write_back(self, node: TreeNode, waited: list[bool]) -> Dropped | None:
        op = self._backup(node)
        if op is None and not waited[0] and self.store is not None and self.store.in_flight():
            # Host full of copies that storage puts still read: let them land, retry.
            waited[0] = True
            self._route(self.store.drain())
            op = self._backup(node)
        if op is not None and self.host is not None:
            self._route([self.host.wait(op)])
        return self.residency.finish_write_back(node)

    def evict_host(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` host tokens from unpinned host-only
        leaves; the nodes are deleted (their pages may live on in storage)."""
        check_count(num_tokens, "num_tokens")
        if self.host is None:
            return 0
        dropped = self.host.evict(num_tokens)
        self._route_dropped(dropped, "host")
        return sum(len(d.node.key) for d in dropped)

    def _route_dropped(self, dropped: list[Dropped], medium: str) -> None:
        for d in dropped:
            key = "demoted_tokens_device" if medium == "device" and not d.deleted else None
            self.observer.metrics.add(key or f"evicted_tokens_{medium}", len(d.node.key))
            if d.announced:
                self.observer.removed(d.node, "device" if medium == "device" else "host")
            if medium == "host" and d.deleted:
                self.residency.remove_leaf(d.node)

    def _make_host_room(self, num_tokens: int) -> None:
        assert self.host is not None
        self._route_dropped(self.host.make_room(num_tokens), "host")

    # host tier ---------------------------------------------------------------
    def _backup(self, node: TreeNode) -> int | None:
        """Start a D2H copy of ``node``, locked until its ``BackupDone``."""
        if self.host is None or node.device is None or node.host is not None:
            return None
        self._make_host_room(len(node.key))
        op = self.host.backup(node)
        if op is not None:
            self.residency.lock(node)
        return op

    def _selective_backups(self, nodes: list[TreeNode], path: list[TreeNode]) -> None:
        """Back up the hot ``nodes`` of a match when the write policy says so.
        The match's host copies are pinned meanwhile: making host room must not
        evict a host-only node the match is about to return."""
        if self.host is None:
            return
        threshold = self.config.policy.write_through_threshold
        hot = [
            n
            for n in nodes
            if n.host is None and n.backup_op is None and self._write.on_hit(n.hit_count, threshold)
        ]
        if not hot:
            return
        pin = self.host.pin(n for n in path if n.host is not None)
        try:
            for node in hot:
                self._backup(node)
        finally:
            self.host.unpin(pin)

    def init_load_back(self, last_host_node: TreeNode, host_hit_length: int) -> LoadBackResult:
        """Bring the host-only nodes above ``last_host_node`` back to device:
        device slots are allocated (evicting if needed) and the H2D copy is
        queued; ``start_loading()`` launches it and ``wait_layer(i)`` gates
        attention. Loads below ``policy.load_back_threshold`` tokens, or that
        cannot get device slots, load nothing (``loaded_tokens == 0``)."""
        check_count(host_hit_length, "host_hit_length")
        if self.host is None or self.host.transfer is None:
            raise CacheError("the host tier is disabled or closed")
        self.residency.check_node(last_host_node, locked=False)
        chain = self.residency.host_chain(last_host_node)
        total = sum(len(n.key) for n in chain)
        anchor = chain[0].parent if chain else last_host_node
        assert anchor is not None
        threshold = max(self.config.policy.load_back_threshold, 1)
        if total == 0 or total < threshold or host_hit_length <= 0:
            return LoadBackResult(empty_slots(), anchor, 0)
        # Pin what we stand on while allocation evicts: the device prefix and
        # the host copies to load.
        self.residency.lock(anchor)
        pin = self.host.pin(chain)
        try:
            slots = self._alloc_device(total)
        finally:
            self.host.unpin(pin)
            self.residency.unlock(anchor)
        if slots is None:
            return LoadBackResult(empty_slots(), anchor, 0)
        self.residency.attach_device(chain, slots)
        self.residency.lock(chain[-1])
        self.host.queue_load(chain, slots)
        return LoadBackResult(slots.clone(), chain[-1], int(slots.numel()))

    def admit(self, match: MatchResult) -> AdmitResult:
        """Take a match into use: load its host hit back when worth it and lock
        the prefix's last node for the request. The caller still calls
        ``start_loading()`` once for the batch, and ``dec_lock_ref`` /
        ``cache_*_req`` on ``result.last_node`` later."""
        prefix, last, loaded = match.device_indices, match.last_device_node, 0
        if match.host_hit_length and self.transfer is not None and self._worth_loading(match):
            lb = self.init_load_back(match.last_host_node, match.host_hit_length)
            if lb.loaded_tokens:
                prefix, last = torch.cat([prefix, lb.device_indices]), lb.last_node
                loaded = lb.loaded_tokens
        self.residency.lock(last)
        return AdmitResult(prefix, last, loaded)

    def _worth_loading(self, match: MatchResult) -> bool:
        """The prefetch policy's word on loading the host hit back (``cost``:
        only when it arrives clearly before it could be recomputed)."""
        bpt = self.device_pool.shape.bytes_per_token
        parts = PrefixParts(match.device_hit_length, match.host_hit_length, 0, self.page_size, bpt)
        return self._prefetch.plan(parts, self.observer.rates.snapshot(), self._cost).host > 0

    def record_prefill(self, tokens: int, seconds: float) -> None:
        """The engine computed ``tokens`` new tokens (all its requests') in one
        forward pass of ``seconds``: the prefill speed the ``cost`` policy
        weighs loads against. ValueError for bad figures."""
        self.observer.rates.record_prefill(tokens, seconds)

    def rates(self) -> RatesSnapshot:
        """What was measured: each link's bandwidth (with its spread) and the
        prefill speed by length (thread-safe; ``format_rates`` prints it)."""
        return self.observer.rates.snapshot()

    def start_loading(self) -> None:
        """Launch every queued load-back, layer by layer: the loads the next
        forward pass reads. Call once per batch, before its ``wait_layer``s."""
        if self.host is not None:
            self.host.start_loading()

    def wait_layer(self, layer: int) -> None:
        """Block until layer ``layer`` of this batch's loads is on device.
        TransferError if one of them failed: the pass must not use its KV."""
        if self.host is not None:
            self.host.wait_layer(layer)

    # storage tier --------------------------------------------------------------
    def prefetch(
        self, request_id: str, tokens: Tokens, namespace: str | None, last_host_node: TreeNode
    ) -> int:
        """Look up, and fetch into reserved host slots, the pages of ``tokens``
        past ``last_host_node`` that storage holds: one job on the storage I/O
        workers (this call never waits for the backend). Returns the tokens
        looked up (0 when fewer than ``policy.prefetch_threshold`` could be,
        when the policy judges none worth reading, or no host room);
        ``check_prefetch`` reports how many arrived. On completion they are
        inserted as host-only nodes. CacheError if ``request_id`` already has
        a prefetch."""
        check_request_id(request_id)
        if self.store is None or self.host is None:
            return 0
        if self.store.has_prefetch(request_id):
            raise CacheError(f"request {request_id!r} already has a prefetch")
        check_namespace(namespace)
        key = as_token_list(tokens)
        self.residency.check_node(last_host_node, locked=False)
        start = check_on_path(self.tree, last_host_node, key, namespace, "last_host_node")
        aligned, ps = align_down(len(key), self.page_size), self.page_size
        min_pages = -(-self.config.policy.prefetch_threshold // ps)
        if aligned - start <= 0 or aligned - start < self.config.policy.prefetch_threshold:
            return 0
        chain, bpt = (
            self.residency.host_chain(last_host_node),
            self.device_pool.shape.bytes_per_token,
        )
        host_len = sum(len(n.key) for n in chain)
        parts = PrefixParts(start - host_len, host_len, aligned - start, ps, bpt)
        plan = StoragePlan(self._prefetch, parts, self.observer.rates.snapshot(), self._cost)
        if not plan.pages((aligned - start) // ps) and not plan.pages(min_pages):
            self.observer.metrics.add("prefetch_started")  # judged too slow: not even looked up
            self.observer.metrics.add("prefetch_declined")
            return 0
        keys = page_keys(self.keys.chain_from(last_host_node), namespace, key[start:aligned], ps)
        pin = self.host.pin(chain)  # what the pages hang from
        self._make_host_room(aligned - start)
        slots = self.host.reserve(aligned - start)
        if slots is None:
            self.host.unpin(pin)
            return 0
        self.store.start_prefetch(
            request_id, key, namespace, start, keys, slots, pin, min_pages, plan, bpt * ps
        )
        self.observer.metrics.add("prefetch_started")
        return aligned - start

    def check_prefetch(self, request_id: str) -> PrefetchStatus:
        """Progress of ``request_id``'s prefetch (tokens arrived so far) and
        whether the request may proceed under ``policy.prefetch_policy``; never
        waits. CacheError if unknown."""
        state = self.store.prefetch(request_id) if self.store else None
        if state is None or self.store is None:
            raise CacheError(f"no prefetch for request {request_id!r}")
        if not state.done:
            self._route(self.store.poll())
        policy, total = self.config.policy, len(state.keys) * self.page_size
        budget = policy.prefetch_timeout_base_s + policy.prefetch_timeout_per_1k_s * total / 1000
        return self.store.status(state, self._prefetch, budget)

    def wait_prefetch(self, request_id: str, timeout_s: float | None = None) -> PrefetchStatus:
        """Block until ``request_id``'s prefetch has landed and been inserted,
        at most ``timeout_s`` (default and cap: ``storage.timeout_s``); after
        the default bound the request goes on without it (``ready``, not
        ``done``: the job lands later). With ``timeout_s``, ``ready`` is the
        policy's."""
        if self.store is None:
            raise CacheError(f"no prefetch for request {request_id!r}")
        job = self.store.prefetch_job(request_id)
        bounded = timeout_s is not None
        if job is not None:
            limit = min(timeout_s, self.store.timeout_s) if timeout_s is not None else None
            self._route(self.store.wait(job, limit, quiet=bounded))
        status = self.check_prefetch(request_id)
        return status if status.done or bounded else status._replace(ready=True)

    def release_prefetch(self, request_id: str) -> None:
        """The request goes on (how long it waited goes into the
        ``prefetch_wait`` histogram). A fetch still running hands the pages
        that have arrived to the tree now; under a policy that cuts (``cost``)
        the rest of it stops, else it is inserted when it lands. CacheError
        if unknown."""
        if self.store is None:
            raise CacheError(f"no prefetch for request {request_id!r}")
        state = self.store.prefetch(request_id)
        waited = self.observer.rates.clock() - state.started
        if not state.done:
            got = self.store.take_arrived(request_id, self._prefetch.cuts)
            if got.cut:
                self.observer.metrics.add("prefetch_cuts")
                if got.seconds > 0:  # counts with what it moved (a page at least: one was due)
                    page = self.page_size * self.device_pool.shape.bytes_per_token
                    self.observer.rates.record_s2h(max(got.nbytes, page), got.seconds)
            self._adopt_prefetched(got.state, got.lo, got.hi)
        self.store.release(request_id)
        self.observer.latency("prefetch_wait", waited)  # prefetch() until the request went on

    def _finish_prefetch(self, done: PrefetchDone) -> None:
        assert self.host is not None
        state = done.state
        got = max(done.fetched_pages * self.page_size, state.taken)
        self.observer.metrics.record_transfer("s2h", done.nbytes, done.ok)
        outcome = prefetch_outcome(done, self.page_size, self.config.policy.prefetch_threshold)
        self.observer.metrics.add(f"prefetch_{outcome}")
        if done.read is not None and not state.cut:  # a cut read was counted when cut
            self.observer.rates.record_s2h(*done.read)
        self.host.free_reserved(state.host_slots[got:])
        self._adopt_prefetched(state, state.taken, got)
        self.host.unpin(state.pin_id)

    def _adopt_prefetched(self, state: PrefetchState, lo: int, hi: int) -> None:
        """Tokens ``[lo, hi)`` of a prefetch's reserved host slots landed: they
        become a host-only node below what the tree holds of their prefix."""
        if hi <= lo:
            return
        assert self.host is not None
        slots, ps = state.host_slots[lo:hi], self.page_size
        graft = self.residency.graft(
            state.key[: state.start + hi], state.namespace, state.start + lo
        )
        # graft.have < 0: the prefix they hang from is gone, nothing to attach to.
        self.host.free_reserved(slots if graft.have < 0 else slots[: graft.have])
        if graft.node is not None:
            self.host.adopt(graft.node, slots[graft.have :])
            self.keys.assign(graft.node, state.keys[(lo + graft.have) // ps : hi // ps])
            self.observer.stored(graft.node, "host")

    # completions -------------------------------------------------------------
    def poll(self) -> PollResult:
        """Apply finished transfers and storage jobs. Call on every scheduler
        tick; never waits."""
        records: list[Record] = []
        if self.host is not None:
            records += self.host.poll()
        if self.store is not None:
            records += self.store.poll()
        counts = self._route(records)
        self._retire_bad_device()
        self.observer.flush()
        return counts

    def drain(self) -> None:
        """Launch queued loads and wait until every transfer and storage job
        has been applied (storage puts started by the backups included).
        Transfers, then storage jobs, are waited for at most
        ``storage.timeout_s`` each in all; work that overruns stays in flight
        (its nodes locked or pinned) and lands in a later ``poll()``."""
        if self.host is None:
            return
        self._route(self.host.drain(self.config.storage.timeout_s))
        if self.store is not None:
            self._route(self.store.drain())
        self.poll()

    def _route(self, records: Sequence[Record]) -> PollResult:
        """Apply each part's records to the parts they concern."""
        backups = loads = failures = 0
        for rec in records:
            if isinstance(rec, BackupDone):
                self._on_backup(rec)
                backups, failures = backups + rec.ok, failures + (not rec.ok)
            elif isinstance(rec, LoadDone):
                self.observer.metrics.record_transfer("h2d", rec.nbytes, True)
                if rec.copy_s > 0:  # the engine timed the copy itself
                    self.observer.rates.record_h2d(rec.nbytes, rec.copy_s)
                self.observer.latency("load_back", rec.seconds)
                for n in rec.nodes:
                    self.observer.stored(n, "device")
                self.residency.unlock(rec.node)
                loads += 1
            elif isinstance(rec, LoadFailed):
                self.observer.metrics.record_transfer("h2d", 0, False)
                self.residency.mark_bad(rec.nodes)
                self.residency.unlock(rec.node)
                failures += 1
            else:
                self._route_storage(rec)
        return PollResult(backups, loads, failures)

    def _on_backup(self, rec: BackupDone) -> None:
        self.observer.metrics.record_transfer("d2h", rec.nbytes, rec.ok)
        self.residency.unlock(rec.node)
        if not rec.ok:
            return
        self.observer.latency("backup", rec.seconds)
        for n in rec.nodes:
            self.observer.stored(n, "host")
            if self.store is not None and self.host is not None and n.host is not None:
                event = self.observer.stored_event(n, "storage")
                self.store.put(self.keys.of(n), n.host, self.host.pin([n]), event)

    def _route_storage(
        self, rec: PutDone | PrefetchDone | LookupDone | StorageRemoved | WaitTimedOut
    ) -> None:
        if isinstance(rec, WaitTimedOut):
            self.observer.metrics.add("storage_wait_timeouts")
            return
        if not isinstance(rec, StorageRemoved):
            self.observer.storage_calls(rec.timings)
        if isinstance(rec, PutDone):
            assert self.host is not None
            self.host.unpin(rec.pin)
            self.observer.metrics.record_transfer("h2s", rec.nbytes, rec.ok)
            self.observer.stored_leading(rec.event, rec.stored_pages)
        elif isinstance(rec, PrefetchDone):
            self._finish_prefetch(rec)
        elif isinstance(rec, StorageRemoved):
            self.observer.storage_removed(rec.keys)

    def _retire_bad_device(self) -> None:
        """Drop the copies of failed loads once nobody holds them: the device
        copy, and the host copies below it, so the next request recomputes."""
        if self.host is None:
            return
        for dropped in self.residency.retire_bad():
            self._route_dropped(self.host.drop_subtree(dropped.node), "host")

    # administration ------------------------------------------------------------
    def reset(self) -> None:
        """Drop every cached page in the device and host tiers (storage keeps
        its pages). Waits for transfers in flight first (storage jobs at most
        ``storage.timeout_s``); CacheError (nothing dropped) while requests
        hold locks, prefetches are registered, or a storage job still uses
        host pages after that wait."""
        self.drain()
        if self.residency.protected_size() or (self.store and self.store.reserved()):
            raise CacheError("cannot reset while requests hold locks")
        if self.store is not None and self.store.in_flight():
            raise CacheError(
                f"cannot reset: {self.store.in_flight()} storage jobs still use host pages "
                f"after {self.store.timeout_s:g} s (storage.timeout_s)"
            )
        nodes = self.residency.clear()
        if self.host is not None:
            self.host.clear(nodes)
        self.observer.cleared()

    def close(self) -> None:
        """Wait for transfers and storage writes in flight (storage at most
        ``storage.timeout_s``), then stop the workers and close the storage
        backend. Idempotent. A cache never closed is released the same way
        when collected or at interpreter exit."""
        if self._life.released:
            return
        if self.host is not None and self.host.transfer is not None:
            self.drain()
        self._life.release()
        self.store = None

    def __enter__(self) -> HiRadixCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> CacheStats:
        """A snapshot of the cache's counters (thread-safe)."""
        return self.observer.stats()

    def _gauges(self) -> Gauges:
        """Sizes for a Prometheus scrape (on the scrape thread: reads only; the
        backend's ``stats()`` is thread-safe)."""
        host = host_capacity = 0
        if self.host_pool is not None:
            alloc = self.host_pool.allocator
            host, host_capacity = alloc.capacity - alloc.available(), alloc.capacity
        store = self.storage.backend.stats() if self.storage is not None else None
        return Gauges(
            self.device_tokens(),
            host,
            self.protected_size(),
            device_capacity_tokens=self.device_pool.allocator.capacity,
            host_capacity_tokens=host_capacity,
            bytes_per_token=self.device_pool.shape.bytes_per_token,
            storage_bytes=store.bytes_used if store else 0,
            storage_capacity_bytes=store.capacity_bytes if store else 0,
            storage_pages=store.entries if store else 0,
            storage=store,
            rates=self.observer.rates.snapshot(),
        )

    def pretty_print(self) -> str:
        """The tree as indented text, one node a line."""
        return self.tree.render()

    def check_integrity(self) -> None:
        """Assert every invariant of DESIGN §3 and each part's own ``check()``;
        AssertionError names the broken one."""
        check_tree(self.residency.tree, self.page_size)
        self.residency.check()
        reserved = 0
        if self.store is not None:
            self.store.check()
            reserved = self.store.reserved()
        if self.host is not None:
            self.host.check(reserved)
        self.observer.check()
