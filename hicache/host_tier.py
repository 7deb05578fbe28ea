"""The host tier in HiRadixCache: backups (D2H), load-back (H2D), completions."""

from __future__ import annotations

import logging

import torch

from hicache.cache_state import CacheError, CacheState, empty_slots
from hicache.radix_tree import TreeNode
from hicache.results import (
    AdmitResult,
    LoadBackResult,
    MatchResult,
    PollResult,
)
from transfer import Completion, TransferEngine, TransferError, TransferOp

logger = logging.getLogger("hicache.cache")


class HostTierMixin(CacheState):
    """HiRadixCache's host-tier flows (owner thread only; see HiRadixCache)."""

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

    def _selective_backups(self, nodes: list[TreeNode], path: list[TreeNode]) -> None:
        """Under ``write_through_selective``, back up the hot ``nodes`` of a
        match. The match's ``path`` is pinned meanwhile: making host room must
        not evict a host-only node the match is about to return."""
        if self._policy.write_policy != "write_through_selective":
            return
        hot = [
            n
            for n in nodes
            if n.host is None
            and n.backup_op is None
            and n.hit_count >= self._policy.write_through_threshold
        ]
        if not hot:
            return
        pinned = [n for n in path if n.host is not None]
        for node in pinned:
            node.host_ref += 1
        try:
            for node in hot:
                self._backup(node)
        finally:
            for node in pinned:
                node.host_ref -= 1

    def _backup(self, node: TreeNode) -> int | None:
        """Start a D2H copy of ``node``; it stays locked until the ack. None
        (and the node stays device-only) when the host tier is off or full."""
        if self.transfer is None or node.device is None or node.host is not None:
            return None  # no host tier (or closed), or nothing to copy
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
        self._transfer()  # CacheError before anything changes when there is no host tier
        self._check_node(last_host_node, locked=False)
        chain = self._host_chain(last_host_node)
        total = sum(len(n.key) for n in chain)
        anchor = chain[0].parent if chain else last_host_node
        assert anchor is not None
        if total == 0 or total < max(self._policy.load_back_threshold, 1) or host_hit_length <= 0:
            return LoadBackResult(empty_slots(), anchor, 0)
        slots = self._alloc_for_load(anchor, chain, total)
        if slots is None:
            return LoadBackResult(empty_slots(), anchor, 0)
        return self._queue_load(chain, slots)

    def admit(self, match: MatchResult) -> AdmitResult:
        """Take a request's match into use: load its host hit back when worth it
        (``init_load_back``) and lock the prefix's last node for the request.
        The caller still calls ``start_loading()`` once for the batch, and
        ``dec_lock_ref``/``cache_*_req`` on ``result.last_node`` later."""
        prefix, last, loaded = match.device_indices, match.last_device_node, 0
        if match.host_hit_length and self.transfer is not None:
            lb = self.init_load_back(match.last_host_node, match.host_hit_length)
            if lb.loaded_tokens:
                prefix, last = torch.cat([prefix, lb.device_indices]), lb.last_node
                loaded = lb.loaded_tokens
        self.inc_lock_ref(last)
        return AdmitResult(prefix, last, loaded)

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
        self._queued_loads.add(op)
        return LoadBackResult(slots.clone(), last, int(slots.numel()))

    def start_loading(self) -> None:
        """Launch every queued load-back, layer by layer: the loads the next
        forward pass reads. Call once per batch, before its ``wait_layer``s."""
        if self.transfer is None:
            return
        self._batch_loads = self._queued_loads | self._launched_early
        self._failed_loads &= self._batch_loads  # early-launched ops may have failed already
        if self._queued_loads:
            self.transfer.start_loading()
        self._queued_loads, self._launched_early = set(), set()

    def _launch_early(self) -> None:
        """Launch queued loads now (to wait for them) without ending the
        batch they belong to: its ``wait_layer`` still reports their failure."""
        assert self.transfer is not None
        if self._queued_loads:
            self.transfer.start_loading()
            self._launched_early |= self._queued_loads
            self._queued_loads = set()

    def _settle_loads(self, path: list[TreeNode]) -> None:
        """Apply the completions of loads launched by an earlier batch that a
        match goes through, so that a failed one is known before its nodes
        are handed out again. (The next batch's ``wait_layer`` no longer
        covers them; after a finished forward pass they have landed anyway.)"""
        if self.transfer is None:
            return
        ops = {n.load_op for n in path if n.load_op is not None}
        for op in ops - self._queued_loads:
            if op is not None and op in self._loads:
                self._apply(self.transfer.wait(op))

    def wait_layer(self, layer: int) -> None:
        """Block until layer ``layer`` of this batch's loads is on device.
        TransferError if one of them failed: the pass must not use its KV."""
        if self.transfer is None or not self._batch_loads:
            return
        failed = self._batch_loads & self._failed_loads
        if failed:
            raise TransferError(f"load-back op(s) {sorted(failed)} of this batch failed")
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
            self._announce_storage_removals()
        self._retire_bad_device()
        if self.events is not None:
            self.events.flush()
        return PollResult(*counts)

    def drain(self) -> None:
        """Launch queued loads and wait until every transfer and storage job
        has been applied (storage puts started by the backups included)."""
        if self.transfer is None:
            return
        self._launch_early()
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
            self._failed_loads.add(done.op_id)
        self.dec_lock_ref(node)
        return 1 if done.ok else 2

    def _retire_bad_device(self) -> None:
        """Drop the copies of failed loads once nobody holds them: the device
        copy, and the host copies below it too, so that the next request
        recomputes instead of failing the same load again."""
        self._bad_device = {n for n in self._bad_device if n.tree is self.tree}
        depth = {n: sum(1 for _ in self.tree.path_to_root(n)) for n in self._bad_device}
        for node in sorted(self._bad_device, key=lambda n: -depth[n]):
            if node.lock_ref == 0 and not node.has_device_child():
                self._drop_device(node)
                self._drop_host_subtree(node)

    def _drop_host_subtree(self, node: TreeNode) -> None:
        """Delete the host-only subtree at ``node``, leaves first; pinned nodes
        (and so their ancestors) stay."""
        order = [node]
        for n in order:
            order.extend(n.children.values())
        for n in reversed(order):
            if n.device is None and n.host is not None and n.host_ref == 0 and not n.children:
                self._delete_host_leaf(n)
