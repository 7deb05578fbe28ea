"""The storage tier in HiRadixCache: writes after backups, prefetch into host."""

from __future__ import annotations

import logging
import time

import torch

from hicache.cache_state import CacheError, CacheState, PrefetchState
from hicache.hashing import page_keys
from hicache.radix_tree import Key, Tokens, TreeNode, as_token_list
from hicache.results import (
    PrefetchStatus,
)
from transfer.storage_io import StorageCompletion, StorageJob

logger = logging.getLogger("hicache.cache")


class StorageTierMixin(CacheState):
    """HiRadixCache's storage flows (owner thread only; see HiRadixCache).

    Host copies that a storage job reads or a prefetch hangs from are pinned
    (``host_ref``) under a pin id until the job's completion is applied.
    """

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

    def _store(self, node: TreeNode) -> None:
        """Write ``node``'s (just backed-up) host pages to storage, async."""
        if self.storage is None or node.host is None:
            return
        keys = tuple(self.node_page_keys(node))
        job = self.storage.submit(StorageJob("put", keys, node.host))
        # The event is built now: a split before the ack would change ``node``.
        self._puts[job] = (self._pin([node]), self._stored_event(node, "storage"))

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
        return self._start_prefetch(request_id, key, namespace, last_host_node, start, keys, hits)

    def _start_prefetch(
        self,
        request_id: str,
        key: Key,
        namespace: str | None,
        last: TreeNode,
        start: int,
        keys: list[bytes],
        hits: int,
    ) -> int:
        assert self.storage is not None
        pin = self._pin(self._host_chain(last))  # the prefix the pages hang from
        slots = self._alloc_host(hits)
        if slots is None:
            self._unpin(pin)
            return 0
        n_pages = hits // self.page_size
        job = self.storage.submit(StorageJob("get", tuple(keys[:n_pages]), slots))
        state = PrefetchState(
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
        if self._prefetches.pop(request_id, None) is None:
            raise CacheError(f"no prefetch for request {request_id!r}")

    def _apply_storage(self, done: StorageCompletion) -> None:
        if done.job_id in self._puts:
            pin, event = self._puts.pop(done.job_id)
            self._unpin(pin)
            ok = done.error is None and all(done.results)
            self.metrics.record_transfer("h2s", done.nbytes, ok)
            if not ok:
                logger.debug("storage put %d incomplete: %s", done.job_id, done.error)
            self._emit_leading(event, done.leading_hits)
            return
        state = self._prefetch_jobs.pop(done.job_id, None)
        if state is None:
            logger.warning("completion for unknown storage job %d", done.job_id)
            return
        self._finish_prefetch(state, done)

    def _finish_prefetch(self, state: PrefetchState, done: StorageCompletion) -> None:
        assert self.host_pool is not None
        got = done.leading_hits * self.page_size
        self.metrics.record_transfer("s2h", done.nbytes, done.error is None)
        outcome = "complete" if got == state.host_slots.numel() else "partial" if got else "failed"
        self.metrics.add(f"prefetch_{outcome}")
        if got < state.host_slots.numel():
            self.host_pool.allocator.free(state.host_slots[got:])
        self._insert_host(state, state.host_slots[:got])
        self._unpin(state.pin_id)
        state.fetched, state.done = got, True

    def _insert_host(self, state: PrefetchState, slots: torch.Tensor) -> None:
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
