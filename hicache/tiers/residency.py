"""The residency tree: which prefixes are cached and where their device copy is.

``ResidencyTree`` owns the radix tree's structure, each node's device copy
(``node.dev``, int64 numpy; ``node.device`` is its tensor view), locks
(``lock_ref``), use statistics (``hit_count``, ``last_access``,
``priority``), device accounting (evictable and protected
tokens), the evictable-leaf set, and the nodes whose device copy is unusable
(failed loads). Every device slot it takes or frees goes through the device
allocator's ownership transitions, checked before anything changes.

Owner thread only. It never calls another part: what it dropped comes back
as ``Dropped`` records for the façade to route.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from device_pool import PagedAllocator
from hicache.policies.eviction import EvictionPolicy
from hicache.tiers.records import Dropped
from hicache.tiers.results import DeviceShortfall, InsertResult
from hicache.tree.door import InsertArgs, check_insert
from hicache.tree.errors import CacheError
from hicache.tree.paging import empty_slots
from hicache.tree.radix_tree import Key, RadixTree, Tokens, TreeNode


class PathMatch(NamedTuple):
    """A touched match path: device prefix parts, where each tier's prefix ends."""

    device_indices: torch.Tensor
    last_device: TreeNode
    last_host: TreeNode
    host_len: int
    device_nodes: list[TreeNode]


class InsertOutcome(NamedTuple):
    """An insert: the result for the caller, the nodes that became device
    resident (to announce), and the node added (to back up), if any."""

    result: InsertResult
    new_device: list[TreeNode]
    added: TreeNode | None


class EvictPass(NamedTuple):
    """One eviction sweep: tokens freed, what was dropped, and the leaves that
    need a backup first (freed only after ``finish_write_back``)."""

    freed: int
    dropped: list[Dropped]
    write_back: list[TreeNode]


class Graft(NamedTuple):
    """``graft``: tokens past ``start`` the tree already held (< 0: the prefix
    above ``start`` is gone), and the node added for the rest, if any."""

    have: int
    node: TreeNode | None


class _InsertPlan(NamedTuple):
    pos: int  # request tokens the path already covers
    to_tree: list[np.ndarray]  # request slots that become the tree's
    revive: list[tuple[TreeNode, np.ndarray]]  # host-only nodes given device slots
    to_free: list[np.ndarray]  # request slots duplicating the tree's


def _np(t: torch.Tensor | np.ndarray) -> np.ndarray:
    """A CPU int64 slot tensor's numpy view (a copy from another device; an
    array as is): numpy's per-call cost is a fraction of torch's on these
    small arrays."""
    if isinstance(t, np.ndarray):
        return t
    return t.numpy() if t.is_cpu else t.cpu().numpy()


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    """``np.concatenate`` that skips the copy for zero or one non-empty part."""
    parts = [p for p in parts if p.size]
    if len(parts) > 1:
        return np.concatenate(parts)
    return parts[0] if parts else NO_SLOTS


_HeapEntry = tuple[tuple[int, int], int, int, TreeNode]  # key, node id, push number, node

NO_SLOTS = np.empty(0, dtype=np.int64)  # never written: numpy views of it are read only
NO_SLOTS.flags.writeable = False


class ResidencyTree:
    """The tree and device residency (see the module docstring)."""

    def __init__(
        self,
        page_size: int,
        allocator: PagedAllocator,
        policy: EvictionPolicy,
        on_split: Callable[[TreeNode, TreeNode], None],
    ) -> None:
        """``on_split(upper, lower)`` lets the façade tell other parts of a split."""
        self.page_size = page_size
        self.allocator = allocator
        self._policy = policy
        self._on_split_outside = on_split
        self.tree = RadixTree(page_size, on_split=self._on_split)
        self._evictable = 0
        self._protected = 0
        self._leaves: set[TreeNode] = set()
        # Eviction candidates by the policy: every leaf has an entry whose key is
        # at most its current one (policy keys only grow: clocks and counts), so
        # stale or departed entries are skipped or re-pushed when they surface,
        # instead of a heap rebuilt from every leaf on each eviction.
        self._heap: list[_HeapEntry] = []
        self._pushes = 0
        self._bad: set[TreeNode] = set()

    # sizes ---------------------------------------------------------------
    @property
    def root(self) -> TreeNode:
        return self.tree.root

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def device_tokens(self) -> int:
        return self._evictable + self._protected

    def shortfall(self, needed: int) -> DeviceShortfall:
        """What holds the device pool when ``needed`` tokens cannot be had (read-only)."""
        pinned = sum(len(n.key) for n in self.tree.nodes() if n.host is not None and n.host_ref > 0)
        alloc = self.allocator
        held = alloc.request_held()
        return DeviceShortfall(
            needed, alloc.available(), self._protected, held, self._evictable, pinned
        )

    def is_bad(self, node: TreeNode) -> bool:
        return node in self._bad

    # match ---------------------------------------------------------------
    def walk(
        self, key: Key, namespace: str | None, start: TreeNode | None = None
    ) -> list[TreeNode]:
        """The nodes ``key`` runs through, splitting where the match ends inside
        one; ``start`` as in ``RadixTree.walk``."""
        return self.tree.walk(key, namespace, split=True, start=start).path

    def touch(self, path: list[TreeNode]) -> PathMatch:
        """Refresh use statistics along ``path`` up to the first failed load."""
        now = self.tree.tick()
        last_device = last_host = self.tree.root
        host_len, parts, device_nodes = 0, [], []
        for node in path:
            if node in self._bad:
                break  # a failed load: neither tier's copy may be used through it
            node.last_access = now
            node.hit_count += 1
            last_host = node
            if node.dev is not None:
                last_device = node
                parts.append(node.dev)
                device_nodes.append(node)
            else:
                host_len += len(node.key)
        indices = torch.from_numpy(np.concatenate(parts)) if parts else empty_slots()
        return PathMatch(indices, last_device, last_host, host_len, device_nodes)

    def depth_tokens(self, node: TreeNode) -> int:
        return sum(len(n.key) for n in self.tree.path_to_root(node))

    def host_chain(self, node: TreeNode) -> list[TreeNode]:
        """Nodes off device from the first below the device prefix down to ``node``."""
        chain: list[TreeNode] = []
        while node is not self.tree.root and node.dev is None:
            chain.append(node)
            assert node.parent is not None
            node = node.parent
        return chain[::-1]

    def prefix_slots(self, node: TreeNode) -> torch.Tensor:
        """Device slots of the whole prefix ending at ``node``."""
        parts = [n.dev for n in self.tree.path_to_root(node) if n.dev is not None]
        return torch.from_numpy(np.concatenate(parts[::-1])) if parts else empty_slots()

    # locks ---------------------------------------------------------------
    def check_node(self, node: TreeNode, locked: bool) -> None:
        if not isinstance(node, TreeNode) or node.tree is not self.tree:
            raise CacheError(f"{node!r} is not a live node of this tree")
        if locked and node is not self.tree.root and node.lock_ref <= 0:
            raise CacheError(f"{node!r} is not locked")

    def check_insert(
        self, tokens: Tokens, slots: torch.Tensor, ns: str | None, last: TreeNode | None
    ) -> InsertArgs:
        """The door of an insert (``tree.door.check_insert``): ``last``, when given, a
        locked live node; raises before anything changes."""
        if last is not None:
            self.check_node(last, locked=True)
        return check_insert(self.tree, tokens, slots, ns, last, self.allocator.page_slots)

    def lock(self, node: TreeNode) -> None:
        """Pin ``node`` and its ancestors on device; CacheError if one is off device."""
        self.check_node(node, locked=False)
        path = list(self.tree.path_to_root(node))
        for n in path:
            if n.dev is None:
                raise CacheError(f"cannot lock {n!r}: it is not on device")
        for n in path:
            if n.lock_ref == 0:
                self._evictable -= len(n.key)
                self._protected += len(n.key)
                self._leaves.discard(n)
            n.lock_ref += 1

    def unlock(self, node: TreeNode) -> None:
        """Undo one ``lock(node)``; CacheError if ``node`` is not locked."""
        self.check_node(node, locked=True)
        for n in self.tree.path_to_root(node):
            n.lock_ref -= 1
            if n.lock_ref == 0:
                self._evictable += len(n.key)
                self._protected -= len(n.key)
                self._refresh_leaf(n)

    # insert --------------------------------------------------------------
    def insert(
        self,
        key: Key,
        slots: torch.Tensor | np.ndarray,
        namespace: str | None,
        free_after: torch.Tensor | np.ndarray,
        finished: bool = False,
        priority: int = 0,
        own_from: int | None = None,
        start: TreeNode | None = None,
    ) -> InsertOutcome:
        """Cache ``key`` (whole pages) whose KV is at ``slots``, then free
        ``free_after`` (request slots past the insert, e.g. a partial page).

        Before anything changes (but the walk's content-neutral split), every
        slot that is not the tree's own copy at its position must be a
        request-held whole page listed once (SlotError otherwise); so must
        every slot from ``own_from`` on (a request's own, past the prefix it
        locked: a tree slot there means it was inserted already). Duplicates
        of what the tree holds are freed; the rest pass to the tree. The
        insert stops at a failed load (see ``InsertResult``). ``start``: a node
        checked to lie on ``key``'s path, where the walk may begin."""
        path = self.walk(key, namespace, start)
        stop = len(path)
        arr = _np(slots)
        if self._bad:  # rare: a failed load on the path stops the insert there
            stop = next((i for i, n in enumerate(path) if n in self._bad), stop)
            if stop < len(path) and own_from is not None:  # slots past stop: checked here
                self.allocator.check_request_held(arr[own_from:])
        plan = self._plan(path[:stop], arr, len(key) if own_from is None else own_from)
        tail = arr[plan.pos :]
        new = tail if stop == len(path) and plan.pos < len(key) else None
        to_tree, to_free = list(plan.to_tree), [*plan.to_free, _np(free_after)]
        if new is not None:
            to_tree.append(new)
        if stop < len(path) and finished:
            to_free.append(self._own_past(path[stop:], tail))
        self.allocator.commit_request(_cat(to_tree), _cat(to_free))
        # Checked and committed: from here on nothing raises.
        prefix_len = sum(len(n.key) for n in path)
        last = self._apply_insert(path[:stop], plan, priority)
        if new is None:
            inserted = len(key) if stop == len(path) else plan.pos
            return InsertOutcome(
                InsertResult(prefix_len, last, inserted), [n for n, _ in plan.revive], None
            )
        added = self.tree.add_child(last, key[plan.pos :], namespace)
        added.last_access, added.priority = self.tree.now(), priority
        added.dev = new.copy()
        self._add_device(added)
        result = InsertResult(prefix_len, added, len(key))
        return InsertOutcome(result, [*[n for n, _ in plan.revive], added], added)

    def _plan(self, path: list[TreeNode], slots: np.ndarray, own_from: int) -> _InsertPlan:
        """Slots past ``own_from`` all go to the commit's checks: a request's
        own slots never equal the tree's, so a tree slot there is refused."""
        pos, to_tree, revive, to_free = 0, [], [], []
        for node in path:
            seg = slots[pos : pos + len(node.key)]
            start, pos = pos, pos + len(node.key)
            have = node.dev
            if have is None:
                revive.append((node, seg))
                to_tree.append(seg)
            elif start >= own_from:
                to_free.append(seg)
            elif have.tobytes() != seg.tobytes():  # the usual case: the match's own slots
                to_free.append(seg[have != seg])
        return _InsertPlan(pos, to_tree, revive, to_free)

    @staticmethod
    def _own_past(nodes: list[TreeNode], slots: np.ndarray) -> np.ndarray:
        """A finished request's slots that ``nodes`` (past a failed load) do not hold."""
        own, pos = [], 0
        for node in nodes:
            part = slots[pos : pos + len(node.key)]
            own.append(part if node.dev is None else part[node.dev != part])
            pos += len(node.key)
        own.append(slots[pos:])
        return np.concatenate(own)

    def _apply_insert(
        self,
        path: list[TreeNode],
        plan: _InsertPlan,
        priority: int,
    ) -> TreeNode:
        now = self.tree.tick()
        for node in path:
            node.last_access = now
            node.priority = max(node.priority, priority)
        for node, seg in plan.revive:  # a host-only node gets the fresh KV
            node.dev = seg.copy()
            self._add_device(node)
        return path[-1] if path else self.tree.root

    def graft(self, key: Key, namespace: str | None, start: int) -> Graft:
        """Add ``key[start:]`` below what the tree holds of ``key`` as a node in
        no tier yet: the caller gives it a host copy at once (a prefetch)."""
        walk = self.tree.walk(key, namespace, split=True)
        have = walk.length - start
        if have < 0 or walk.length >= len(key):
            return Graft(have, None)
        node = self.tree.add_child(walk.node, key[walk.length :], namespace)
        node.last_access = self.tree.tick()
        return Graft(have, node)

    # device copies ---------------------------------------------------------
    def attach_device(self, chain: list[TreeNode], slots: torch.Tensor) -> None:
        """Give the host-only ``chain`` the request-held ``slots`` (a load-back)."""
        self.allocator.to_tree(slots)
        arr, pos = _np(slots).copy(), 0  # the tree's own copy: the caller keeps ``slots``
        for node in chain:
            node.dev = arr[pos : pos + len(node.key)]
            pos += len(node.key)
            self._add_device(node)

    def _add_device(self, node: TreeNode) -> None:
        if node.lock_ref:
            self._protected += len(node.key)
        else:
            self._evictable += len(node.key)
        self._refresh_leaf(node)
        if node.parent is not None:
            node.parent.dev_children += 1
            self._leaves.discard(node.parent)

    def drop_device(self, node: TreeNode) -> Dropped:
        """Free an unlocked node's device copy; it is deleted when no tier is left."""
        assert node.dev is not None and node.lock_ref == 0
        announced = node not in self._bad
        self.allocator.free_tree(node.dev)
        self._evictable -= len(node.key)
        node.dev = None
        self._leaves.discard(node)
        self._bad.discard(node)
        parent = node.parent
        if parent is not None:
            parent.dev_children -= 1
        deleted = node.host is None and not node.children
        if deleted:
            self.tree.remove_leaf(node)
        if parent is not None:
            self._refresh_leaf(parent)
        return Dropped(node, deleted, announced)

    def remove_leaf(self, node: TreeNode) -> None:
        """Delete a childless node that no tier holds any more."""
        assert node.dev is None and node.host is None
        self.tree.remove_leaf(node)

    def mark_bad(self, nodes: tuple[TreeNode, ...]) -> None:
        self._bad.update(nodes)

    def retire_bad(self) -> list[Dropped]:
        """Drop the device copies of failed loads nobody holds, deepest first."""
        self._bad = {n for n in self._bad if n.tree is self.tree}
        depth = {n: self.depth_tokens(n) for n in self._bad}
        out = []
        for node in sorted(self._bad, key=lambda n: -depth[n]):
            if node.lock_ref == 0 and not node.has_device_child():
                out.append(self.drop_device(node))
        return out

    # eviction ------------------------------------------------------------
    def evict_pass(self, num_tokens: int, write_back: Callable[[TreeNode], bool]) -> EvictPass:
        """One sweep over the current leaves, by the eviction policy. A leaf with
        a host copy is demoted; one for which ``write_back(node)`` holds is left
        for a backup; any other is deleted."""
        freed, dropped, later = 0, [], []
        while freed < num_tokens:
            node = self._pop_leaf()
            if node is None:
                break
            freed += len(node.key)
            if node.host is None and write_back(node):
                later.append(node)
                continue  # its parent stays on device until the backup lands
            dropped.append(self.drop_device(node))  # a parent left a leaf is pushed
        for node in later:  # still leaves until their backup lands: candidates next pass
            self._push(node)
        return EvictPass(freed, dropped, later)

    def _push(self, node: TreeNode) -> None:
        if len(self._heap) > 2 * len(self._leaves) + 64:  # mostly stale: rebuild, O(leaves)
            self._compact()
        self._pushes += 1
        heapq.heappush(self._heap, (self._policy.sort_key(node), node.id, self._pushes, node))

    def _pop_leaf(self) -> TreeNode | None:
        """The current leaf first by the policy (and id), taken off the heap;
        None when there is none. Entries of nodes that left the leaf set are
        dropped; one whose key grew since it was pushed goes back with its new key."""
        heap, leaves, key = self._heap, self._leaves, self._policy.sort_key
        while heap:
            entry = heapq.heappop(heap)
            node = entry[3]
            if node not in leaves:
                continue
            now = key(node)
            if now == entry[0]:
                return node
            self._pushes += 1
            heapq.heappush(heap, (now, node.id, self._pushes, node))
        return None

    def _compact(self) -> None:
        key, base = self._policy.sort_key, self._pushes
        self._heap = [(key(n), n.id, base + i, n) for i, n in enumerate(self._leaves, 1)]
        self._pushes += len(self._heap)
        heapq.heapify(self._heap)

    def finish_write_back(self, node: TreeNode) -> Dropped | None:
        """After a write-back's backup: drop the device copy if still possible."""
        if node.dev is None or node.lock_ref:
            return None
        if node.host is not None or not node.children:
            return self.drop_device(node)
        return None

    def _refresh_leaf(self, node: TreeNode) -> None:
        """Keep ``_leaves`` = unlocked device nodes with no device child."""
        if (
            node.tree is not None
            and node is not self.tree.root
            and node.dev is not None
            and node.lock_ref == 0
            and not node.has_device_child()
        ):
            if node not in self._leaves:
                self._leaves.add(node)
                self._push(node)
        else:
            self._leaves.discard(node)

    def _on_split(self, upper: TreeNode, lower: TreeNode) -> None:
        if lower in self._bad:  # both halves of a failed load are unusable
            self._bad.add(upper)
        self._on_split_outside(upper, lower)

    # admin ---------------------------------------------------------------
    def clear(self) -> list[TreeNode]:
        """Free every device copy and empty the tree; returns the removed nodes."""
        nodes = list(self.tree.nodes())
        for node in nodes:
            if node.dev is not None:
                self.allocator.free_tree(node.dev)
                node.dev = None
            node.dev_children = 0
            node.tree = None
        self.tree.root.children.clear()
        self.tree.root.dev_children = 0
        self._leaves.clear()
        self._heap.clear()
        self._bad.clear()
        self._evictable = 0
        return nodes

    def check(self) -> None:
        """Assert the leaf set, the device accounting and slot ownership."""
        nodes = list(self.tree.nodes())
        leaves = {
            n for n in nodes if n.dev is not None and n.lock_ref == 0 and not n.has_device_child()
        }
        assert self._leaves == leaves, "evictable-leaf set is out of date"
        key = self._policy.sort_key
        queued: dict[TreeNode, tuple[int, int]] = {}
        for entry in self._heap:
            queued[entry[3]] = min(entry[0], queued.get(entry[3], entry[0]))
        assert all(n in queued and queued[n] <= key(n) for n in leaves), (
            "an evictable leaf is missing from the eviction heap"
        )
        for n in [self.tree.root, *nodes]:
            on_device = sum(c.dev is not None for c in n.children.values())
            assert n.dev_children == on_device, f"{n!r}: device-child count is off"
        held = [n.dev for n in nodes if n.dev is not None]
        tree_held = sum(t.size for t in held)
        locked = sum(len(n.key) for n in nodes if n.dev is not None and n.lock_ref)
        assert self._protected == locked, "inv5: protected_size is off"
        assert self._evictable == tree_held - locked, "inv5: evictable_size is off"
        counts = self.allocator.counts()
        assert counts.tree == tree_held, (
            f"inv5: the allocator says {counts.tree} device slots are the tree's, "
            f"the tree holds {tree_held}"
        )
        if held:
            self.allocator.whole_pages(np.concatenate(held))  # SlotError: a slot held twice
        assert all(n.tree is self.tree for n in self._bad), "a failed load left the tree"
