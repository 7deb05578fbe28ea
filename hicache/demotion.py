"""Demotion: pages going down a tier, for the façade.

Device→host backups as the write policy asks for them (on insert, on a hit, when
a leaf is evicted); eviction from the device by the eviction policy (a leaf with
a host copy is demoted, one the write policy keeps is backed up first, the rest
deleted) and from the host (host-only leaves, their pages living on in
storage); the room a device allocation or a host reservation needs; and what
eviction drops: its counters and events, and the host-only nodes it removes.

``HiRadixCache`` owns one and calls it on its owner thread. A backup locks its
node until the ``BackupDone`` the façade routes; when eviction must wait for a
backup or for storage writes, the records the wait returns go to the façade's
``route``. The storage tier comes with the calls that may wait for it: the
façade drops it when it closes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

import torch

from hicache.config.cache import PolicyConfig
from hicache.observe.observer import Observer
from hicache.policies.write import create_write_policy
from hicache.tiers.host import HostTier
from hicache.tiers.records import Dropped, Record
from hicache.tiers.residency import ResidencyTree
from hicache.tiers.results import EvictResult, PollResult
from hicache.tiers.storage import StorageTier
from hicache.tree.radix_tree import TreeNode

logger = logging.getLogger(__name__)

Route = Callable[[Sequence[Record]], PollResult]  # the façade applies records


class Demotion:
    """Backups, eviction and room for the façade (see the module docstring).

    Owner thread only; counts are checked by the façade before they get here.
    """

    def __init__(
        self,
        policy: PolicyConfig,
        residency: ResidencyTree,
        host: HostTier | None,
        observer: Observer,
        route: Route,
    ) -> None:
        self._threshold = policy.write_through_threshold
        self._write = create_write_policy(policy.write_policy)
        self._residency = residency
        self._host = host
        self._observer = observer
        self._route = route

    # room ------------------------------------------------------------------
    def alloc_device(self, num_tokens: int, store: StorageTier | None) -> torch.Tensor | None:
        """``num_tokens`` (whole pages) request-held device slots, evicting as needed;
        when only backups in flight (locked) stand in the way, wait for their acks
        and retry rather than fail. None (logged) if even that cannot make room."""
        alloc = self._residency.allocator
        if alloc.available() < num_tokens:
            self.evict(num_tokens - alloc.available(), store)
        short = alloc.available() < num_tokens
        if short and self._host is not None and self._host.backups_in_flight():
            self._route(self._host.wait_backups())
            self.evict(num_tokens - alloc.available(), store)
        slots = alloc.alloc(num_tokens)
        if slots is None:
            logger.info("device allocation failed: %s", self._residency.shortfall(num_tokens))
        return slots

    def make_host_room(self, num_tokens: int) -> None:
        """Free host slots for ``num_tokens``, evicting unpinned host-only leaves."""
        assert self._host is not None
        self.dropped(self._host.make_room(num_tokens), "host")

    # eviction ----------------------------------------------------------------
    def evict(self, num_tokens: int, store: StorageTier | None) -> EvictResult:
        """``HiRadixCache.evict``: with ``store``, a write-back that finds the host full
        of pages storage puts still read waits for them once."""
        freed = demoted = deleted = 0
        waited = [False]  # one wait for storage per call keeps the call bounded
        while freed < num_tokens:
            step = self._residency.evict_pass(num_tokens - freed, self._needs_write_back)
            dropped = list(step.dropped)
            lost = 0
            for node in step.write_back:
                done = self._write_back(node, waited, store)
                lost += 0 if done is not None else len(node.key)
                dropped += [done] if done is not None else []
            self.dropped(dropped, "device")
            if step.freed - lost == 0:
                break
            freed += step.freed - lost
            demoted += sum(len(d.node.key) for d in dropped if not d.deleted)
            deleted += sum(len(d.node.key) for d in dropped if d.deleted)
        return EvictResult(freed, demoted, deleted)

    def _needs_write_back(self, node: TreeNode) -> bool:
        # Host-only children would be orphaned by deleting their parent.
        return self._host is not None and (self._write.on_evict or bool(node.children))

    def _write_back(
        self, node: TreeNode, waited: list[bool], store: StorageTier | None
    ) -> Dropped | None:
        op = self.backup(node)
        if op is None and not waited[0] and store is not None and store.in_flight():
            # Host full of copies that storage puts still read: let them land, retry.
            waited[0] = True
            self._route(store.drain())
            op = self.backup(node)
        if op is not None and self._host is not None:
            self._route([self._host.wait(op)])
        return self._residency.finish_write_back(node)

    def evict_host(self, num_tokens: int) -> int:
        """``HiRadixCache.evict_host``."""
        if self._host is None:
            return 0
        dropped = self._host.evict(num_tokens)
        self.dropped(dropped, "host")
        return sum(len(d.node.key) for d in dropped)

    def retire_bad(self) -> None:
        """Drop the copies of failed loads once nobody holds them: the device
        copy, and the host copies below it, so the next request recomputes."""
        if self._host is None:
            return
        for dropped in self._residency.retire_bad():
            self.dropped(self._host.drop_subtree(dropped.node), "host")

    def dropped(self, dropped: Iterable[Dropped], medium: str) -> None:
        """What eviction dropped from ``medium``: counted, announced, and a deleted
        host-only node removed from the tree."""
        for d in dropped:
            key = "demoted_tokens_device" if medium == "device" and not d.deleted else None
            self._observer.metrics.add(key or f"evicted_tokens_{medium}", len(d.node.key))
            if d.announced:
                self._observer.removed(d.node, "device" if medium == "device" else "host")
            if medium == "host" and d.deleted:
                self._residency.remove_leaf(d.node)

    # backups -----------------------------------------------------------------
    def backup(self, node: TreeNode) -> int | None:
        """Start a D2H copy of ``node``, locked until its ``BackupDone``."""
        if self._host is None or node.device is None or node.host is not None:
            return None
        self.make_host_room(len(node.key))
        op = self._host.backup(node)
        if op is not None:
            self._residency.lock(node)
        return op

    def on_insert(self, node: TreeNode) -> None:
        """A node was inserted: back it up if the write policy copies on insert."""
        if self._write.on_insert:
            self.backup(node)

    def on_match(self, nodes: list[TreeNode], path: list[TreeNode]) -> None:
        """Back up the hot ``nodes`` of a match when the write policy says so.
        The match's host copies are pinned meanwhile: making host room must not
        evict a host-only node the match is about to return."""
        host = self._host
        if host is None:
            return
        hot = [
            n
            for n in nodes
            if n.host is None
            and n.backup_op is None
            and self._write.on_hit(n.hit_count, self._threshold)
        ]
        if not hot:
            return
        pin = host.pin(n for n in path if n.host is not None)
        try:
            for node in hot:
                self.backup(node)
        finally:
            host.unpin(pin)
