"""HiRadixCache: the engine-facing tree_cache, a façade over parts it owns.

- ``residency`` (``ResidencyTree``): the tree, locks, device copies and accounting;
- ``host`` (``HostTier``): host copies, backups, load-backs, host eviction;
- ``store`` (``StorageTier``): storage I/O, puts, prefetches, lookups, removals;
- ``observer`` (``Observer``): KV events and metrics.

Parts never call each other: they return typed records (``records.py``) and
this module routes each one to the parts it concerns. The flows that span parts
are two helpers the façade owns: ``Demotion`` (``demotion.py``: backups by the
write policy, eviction, room in the pools) and ``Admission`` (``admission.py``:
a request's host hits loaded back, its storage hits prefetched). ``factory.py``
builds the parts; ``gauges.py`` reads their sizes for a Prometheus scrape.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np
import torch

from device_pool import DeviceKVPool
from hicache.admission import Admission
from hicache.config.cache import CacheConfig
from hicache.demotion import Demotion
from hicache.events.kv import EventSink
from hicache.factory import Given, build_parts
from hicache.gauges import read_gauges
from hicache.keys.hashing import page_keys
from hicache.lifecycle import Lifecycle
from hicache.observe.metrics import CacheMetrics, CacheStats
from hicache.observe.prometheus import Gauges
from hicache.policies.rates import Clock, RatesSnapshot
from hicache.tiers.records import (
    BackupDone,
    LoadDone,
    LoadFailed,
    LookupDone,
    PrefetchDone,
    PutDone,
    Record,
    StorageRemoved,
    WaitTimedOut,
)
from hicache.tiers.residency import NO_SLOTS
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
from hicache.tree.door import (
    InsertArgs,
    check_count,
    check_namespace,
    check_request_id,
)
from hicache.tree.errors import CacheError
from hicache.tree.integrity import check_tree
from hicache.tree.paging import align_down, align_up
from hicache.tree.radix_tree import RadixTree, Tokens, TreeNode, as_token_list
from host_pool import HostKVPool
from storage_backends import StorageBackend
from transfer import TransferEngine
from transfer.storage_io import StorageIO

__all__ = ["CacheError", "HiRadixCache"]

logger = logging.getLogger(__name__)


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
            self._build(config, Given(device_pool, host_pool, transfer, storage))
        except BaseException:
            self._life.release()
            # The parts refer back to this object (callbacks): drop them now so
            # that the pools go with the exception, not at the next GC cycle.
            vars(self).clear()
            raise

    def _build(self, config: CacheConfig, given: Given) -> None:
        self.config = config
        self.page_size = config.device.page_size
        parts = build_parts(config, given, self._life, self._clock, self._on_split, self._gauges)
        self.device_pool, self.host_pool = parts.device_pool, parts.host_pool
        self.fingerprint, self.keys = parts.fingerprint, parts.keys
        self.residency, self.host, self.store = parts.residency, parts.host, parts.store
        self.observer = parts.observer
        policy = config.policy
        self._demotion = Demotion(policy, self.residency, self.host, self.observer, self._route)
        self._admission = Admission(
            policy,
            self.device_pool.shape.bytes_per_token,
            self.residency,
            self.host,
            self.observer,
            self.keys,
            self._demotion,
        )

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
        self._demotion.on_match(found.device_nodes, path)
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
        door = self.residency.check_insert(tokens, device_slots, namespace, None)
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
        door = self.residency.check_insert(tokens, device_slots, namespace, last_node)
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
        door = self.residency.check_insert(tokens, device_slots, namespace, last_node)
        result = self._insert(door, namespace, NO_SLOTS, False, priority)
        self.residency.lock(result.last_node)
        self.residency.unlock(last_node)
        indices = self.residency.prefix_slots(result.last_node)
        return UnfinishedResult(indices, result.last_node, result.prefix_len)

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
            self._demotion.on_insert(out.added)
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
        return self._demotion.alloc_device(align_up(num_tokens, self.page_size), self.store)

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
        return self._demotion.evict(num_tokens, self.store)

    def evict_host(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` host tokens from unpinned host-only
        leaves; the nodes are deleted (their pages may live on in storage)."""
        check_count(num_tokens, "num_tokens")
        return self._demotion.evict_host(num_tokens)

    # host tier ---------------------------------------------------------------
    def init_load_back(self, last_host_node: TreeNode, host_hit_length: int) -> LoadBackResult:
        """Bring the host-only nodes above ``last_host_node`` back to device:
        device slots are allocated (evicting if needed) and the H2D copy is
        queued; ``start_loading()`` launches it and ``wait_layer(i)`` gates
        attention. Loads below ``policy.load_back_threshold`` tokens, or that
        cannot get device slots, load nothing (``loaded_tokens == 0``)."""
        return self._admission.load_back(self.store, last_host_node, host_hit_length)

    def admit(self, match: MatchResult) -> AdmitResult:
        """Take a match into use: load its host hit back when worth it and lock
        the prefix's last node for the request. The caller still calls
        ``start_loading()`` once for the batch, and ``dec_lock_ref`` /
        ``cache_*_req`` on ``result.last_node`` later."""
        return self._admission.admit(self.store, match)

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
        return self._admission.prefetch(self.store, request_id, tokens, namespace, last_host_node)

    def check_prefetch(self, request_id: str) -> PrefetchStatus:
        """Progress of ``request_id``'s prefetch (tokens arrived so far) and
        whether the request may proceed under ``policy.prefetch_policy``; never
        waits. CacheError if unknown."""
        state = self.store.prefetch(request_id) if self.store else None
        if state is None or self.store is None:
            raise CacheError(f"no prefetch for request {request_id!r}")
        if not state.done:
            self._route(self.store.poll())
        return self._admission.status(self.store, state)

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
        self._admission.release(self.store, request_id)

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
        self._demotion.retire_bad()
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
            self._admission.landed(rec)
        elif isinstance(rec, StorageRemoved):
            self.observer.storage_removed(rec.keys)

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
        """Sizes for a Prometheus scrape (on the scrape thread: reads only)."""
        pools, rates = (self.device_pool, self.host_pool), self.observer.rates
        return read_gauges(*pools, self.residency, self.storage, rates)

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
