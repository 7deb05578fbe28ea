"""The host tier: host copies, D2H backups, H2D load-backs, host eviction.

``HostTier`` owns the transfer engine, every node's host copy (``node.host``)
and its pins (``host_ref``, under pin ids), the transfers in flight
(``backup_op``/``load_op`` and the op tables), the current batch's loads and
its failed loads, and host eviction (choosing host-only leaves and freeing
their host slots). Host slots go through the host allocator's ownership
transitions: reserved (request-held) until a node owns them.

Owner thread only. It reads the tree's structure but never changes it:
deleted nodes come back as ``Dropped`` records; finished transfers as
``BackupDone``/``LoadDone``/``LoadFailed`` from ``poll()``.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Iterable

import torch

from hicache.policies.eviction import EvictionPolicy
from hicache.tiers.records import BackupDone, Dropped, LoadDone, LoadFailed
from hicache.tree.errors import CacheError
from hicache.tree.radix_tree import RadixTree, TreeNode
from host_pool import HostKVPool
from transfer import Completion, TransferEngine, TransferError, TransferOp

logger = logging.getLogger("hicache.cache")

TransferRecord = BackupDone | LoadDone | LoadFailed


class HostTier:
    """Host copies and device↔host transfers (see the module docstring)."""

    def __init__(
        self, pool: HostKVPool, transfer: TransferEngine, tree: RadixTree, policy: EvictionPolicy
    ) -> None:
        """``tree`` is read, never written."""
        self.pool = pool
        self.allocator = pool.allocator
        self.transfer: TransferEngine | None = transfer
        self._tree = tree
        self._policy = policy
        self._pins: dict[int, list[TreeNode]] = {}
        self._next_pin = 0
        self._backups: dict[int, TreeNode] = {}  # D2H op -> deepest node backed up
        self._loads: dict[int, TreeNode] = {}  # H2D op -> deepest node loaded
        self._started: dict[int, float] = {}  # op -> perf_counter() at submit
        self._queued: set[int] = set()  # H2D ops submitted since start_loading()
        self._launched_early: set[int] = set()  # queued ops drain() launched
        self._batch: set[int] = set()  # H2D ops the current forward batch reads
        self._failed: set[int] = set()  # failed H2D ops of the current batch

    def engine(self) -> TransferEngine:
        if self.transfer is None:
            raise CacheError("the host tier is closed")
        return self.transfer

    def backups_in_flight(self) -> bool:
        return bool(self._backups)

    # pins ----------------------------------------------------------------
    def pin(self, nodes: Iterable[TreeNode]) -> int:
        """Keep the host copies of ``nodes`` (``host_ref``) until ``unpin``."""
        self._next_pin += 1
        held = list(nodes)
        for node in held:
            node.host_ref += 1
        self._pins[self._next_pin] = held
        return self._next_pin

    def unpin(self, pin_id: int) -> None:
        for node in self._pins.pop(pin_id):
            node.host_ref -= 1

    def on_split(self, upper: TreeNode, lower: TreeNode) -> None:
        """A pin on ``lower`` covered pages that now live partly in ``upper``."""
        if lower.host_ref:
            for nodes in self._pins.values():
                if lower in nodes:
                    nodes.append(upper)

    # host slots ------------------------------------------------------------
    def make_room(self, num_tokens: int) -> list[Dropped]:
        """Evict host leaves until ``num_tokens`` host slots are free (if possible)."""
        short = num_tokens - self.allocator.available()
        return self.evict(short) if short > 0 else []

    def reserve(self, num_tokens: int) -> torch.Tensor | None:
        """Host slots held for a job (request-held in the allocator), or None."""
        return self.allocator.alloc(num_tokens)

    def free_reserved(self, slots: torch.Tensor) -> None:
        self.allocator.free_request(slots)

    def adopt(self, node: TreeNode, slots: torch.Tensor) -> None:
        """Reserved ``slots`` become ``node``'s host copy."""
        self.allocator.to_tree(slots)
        node.host = slots.clone()

    def evict(self, num_tokens: int) -> list[Dropped]:
        """Free at least ``num_tokens`` host tokens from unpinned host-only
        leaves, by the eviction policy; their nodes are to be deleted (children
        before parents, in the order returned)."""
        key = self._policy.sort_key
        gone: set[TreeNode] = set()
        heap = [(key(n), n.id, n) for n in self._tree.nodes() if self._host_leaf(n, gone)]
        heapq.heapify(heap)
        freed, out = 0, []
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            freed += len(node.key)
            out.append(self._drop_host(node, gone))
            parent = node.parent
            if parent is not None and self._host_leaf(parent, gone):
                heapq.heappush(heap, (key(parent), parent.id, parent))
        return out

    def drop_subtree(self, node: TreeNode) -> list[Dropped]:
        """Drop the host-only subtree at ``node``, leaves first; pinned nodes
        (and so their ancestors) stay."""
        order, gone = [node], set[TreeNode]()
        for n in order:
            order.extend(n.children.values())
        return [self._drop_host(n, gone) for n in reversed(order) if self._host_leaf(n, gone)]

    def _host_leaf(self, node: TreeNode, gone: set[TreeNode]) -> bool:
        return (
            node.tree is self._tree
            and node is not self._tree.root
            and node.device is None
            and node.host is not None
            and node.host_ref == 0
            and all(c in gone for c in node.children.values())
        )

    def _drop_host(self, node: TreeNode, gone: set[TreeNode]) -> Dropped:
        assert node.host is not None
        self.allocator.free_tree(node.host)
        node.host = None
        gone.add(node)
        return Dropped(node, deleted=True)

    def clear(self, nodes: list[TreeNode]) -> None:
        """Free the host copies of ``nodes`` (the tree is being emptied)."""
        for node in nodes:
            if node.host is not None:
                self.allocator.free_tree(node.host)
                node.host = None

    # backups ---------------------------------------------------------------
    def backup(self, node: TreeNode) -> int | None:
        """Start a D2H copy of ``node`` (lock it until ``BackupDone``). None when
        there is nothing to copy, the tier is closed or host slots are short
        (call ``make_room`` first)."""
        if self.transfer is None or node.device is None or node.host is not None:
            return None
        host = self.allocator.alloc(len(node.key))
        if host is None:
            logger.debug("host tier full: %r stays device-only", node)
            return None
        self.allocator.to_tree(host)
        node.host = host
        op = self.transfer.submit(TransferOp("d2h", node.device, host))
        node.backup_op = op
        self._backups[op] = node
        self._started[op] = time.perf_counter()
        return op

    def wait_backups(self) -> list[TransferRecord]:
        """Wait for every backup in flight."""
        return [self.wait(op) for op in list(self._backups) if op in self._backups]

    # loads -------------------------------------------------------------------
    def queue_load(self, chain: list[TreeNode], slots: torch.Tensor) -> None:
        """Queue the H2D copy of ``chain``'s host copies into its device ``slots``."""
        hosts = torch.cat([n.host for n in chain if n.host is not None])
        op = self.engine().submit(TransferOp("h2d", slots, hosts))
        for node in chain:
            node.load_op = op
        self._loads[op] = chain[-1]
        self._started[op] = time.perf_counter()
        self._queued.add(op)

    def start_loading(self) -> None:
        """Launch every queued load: the loads the next forward pass reads."""
        if self.transfer is None:
            return
        self._batch = self._queued | self._launched_early
        self._failed &= self._batch  # early-launched ops may have failed already
        if self._queued:
            self.transfer.start_loading()
        self._queued, self._launched_early = set(), set()

    def wait_layer(self, layer: int) -> None:
        """TransferError if a load of this batch failed; else wait for ``layer``."""
        if self.transfer is None or not self._batch:
            return
        failed = self._batch & self._failed
        if failed:
            raise TransferError(f"load-back op(s) {sorted(failed)} of this batch failed")
        self.transfer.wait_layer(layer)

    def settle(self, path: list[TreeNode]) -> list[TransferRecord]:
        """Completions of loads launched by an earlier batch that ``path`` goes
        through, so that a failed one is known before its nodes are handed out."""
        if self.transfer is None:
            return []
        ops = {n.load_op for n in path if n.load_op is not None} - self._queued
        return [self.wait(op) for op in ops if op is not None and op in self._loads]

    # completions -----------------------------------------------------------
    def poll(self) -> list[TransferRecord]:
        """Finished transfers, applied to the host tier's own state."""
        if self.transfer is None:
            return []
        return [self._finish(done) for done in self.transfer.poll()]

    def drain(self, timeout_s: float | None = None) -> list[TransferRecord]:
        """Launch queued loads and wait for every transfer in flight, all
        together at most ``timeout_s``; an op still running then stays in
        flight (its nodes locked) and lands in a later ``poll()``."""
        if self.transfer is None:
            return []
        if self._queued:
            self.transfer.start_loading()
            self._launched_early |= self._queued
            self._queued = set()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        out: list[TransferRecord] = []
        for op in list(self._backups) + list(self._loads):
            if op not in self._backups and op not in self._loads:
                continue
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                out.append(self._finish(self.engine().wait(op, left)))
            except TransferError:
                if deadline is None:
                    raise
                logger.warning("transfer op %d still running after %.1f s", op, timeout_s)
        return out

    def wait(self, op: int) -> TransferRecord:
        return self._finish(self.engine().wait(op))

    def _finish(self, done: Completion) -> TransferRecord:
        seconds = time.perf_counter() - self._started.pop(done.op_id)
        if done.op_id in self._backups:
            return self._finish_backup(self._backups.pop(done.op_id), done, seconds)
        node = self._loads.pop(done.op_id)
        nodes = self._op_nodes(node, "load_op", done.op_id)
        for n in nodes:
            n.load_op = None
        if done.ok:
            return LoadDone(node, nodes, done.nbytes, seconds, done.seconds)
        logger.warning("load-back of %r failed: %s", node, done.error)
        self._failed.add(done.op_id)
        return LoadFailed(node, nodes, done.error)

    def _finish_backup(self, node: TreeNode, done: Completion, seconds: float) -> BackupDone:
        nodes = self._op_nodes(node, "backup_op", done.op_id)
        for n in nodes:
            n.backup_op = None
            if not done.ok and n.host is not None:
                self.allocator.free_tree(n.host)
                n.host = None
        if not done.ok:
            logger.warning("backup of %r failed: %s", node, done.error)
        return BackupDone(node, nodes, done.ok, done.nbytes, done.error, seconds)

    def _op_nodes(self, node: TreeNode, attr: str, op: int) -> tuple[TreeNode, ...]:
        """``node`` and the ancestors split off it that share transfer ``op``."""
        nodes = []
        cur: TreeNode | None = node
        while cur is not None and cur is not self._tree.root and getattr(cur, attr) == op:
            nodes.append(cur)
            cur = cur.parent
        return tuple(nodes)

    def close(self) -> None:
        if self.transfer is not None:
            self.transfer.close()
            self.transfer = None

    def check(self, reserved: int) -> None:
        """Assert host accounting, slot ownership and pins; ``reserved`` is the
        host slots the storage tier holds for prefetches."""
        nodes = list(self._tree.nodes())
        held = [n.host for n in nodes if n.host is not None]
        tree_held = sum(t.numel() for t in held)
        counts = self.allocator.counts()
        assert counts.tree == tree_held, (
            f"inv5: the host allocator says {counts.tree} slots are the tree's, tree {tree_held}"
        )
        assert counts.request == reserved, (
            f"inv5: host reserved {counts.request} != prefetch reservations {reserved}"
        )
        if held:
            self.allocator.whole_pages(torch.cat(held))  # SlotError: a slot held twice
        in_flight = set(self._backups) | set(self._loads)
        assert set(self._started) == in_flight, "a transfer in flight has no start time"
        pinned: dict[TreeNode, int] = {}
        for pin in self._pins.values():
            for n in pin:
                pinned[n] = pinned.get(n, 0) + 1
        for n in nodes:
            assert n.host_ref == pinned.get(n, 0), f"inv4: {n!r} host_ref != its pins"
