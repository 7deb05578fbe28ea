"""``check_integrity()``: assert every invariant of DESIGN §3 on a live cache.

Kept apart from the cache's policy code because it is long and read rarely;
it reads the cache's bookkeeping on purpose, to check it against the tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hicache.radix_tree import TreeNode

if TYPE_CHECKING:
    from hicache.cache import HiRadixCache


def check_tree(cache: HiRadixCache) -> None:
    """Raise AssertionError naming the first broken invariant."""
    tree = cache.tree
    nodes = list(tree.nodes())
    for node in nodes:
        _check_node_shape(cache, node)
        _check_residency(cache, node)
        _check_locks(cache, node)
    _check_device_accounting(cache, nodes)
    _check_leaves(cache, nodes)
    if cache.host_pool is not None:
        _check_host_accounting(cache, nodes)


def _check_node_shape(cache: HiRadixCache, node: TreeNode) -> None:
    ps, tree = cache.page_size, cache.tree
    n = len(node.key)
    assert n > 0 and n % ps == 0, f"inv6: {node!r} key length {n} is not whole pages"
    parent = node.parent
    assert parent is not None and node.tree is tree, f"{node!r} is detached but reachable"
    ckey = tree.child_key(parent, node.key, 0, node.namespace)
    assert parent.children.get(ckey) is node, f"inv6: {node!r} is not under its first page"
    if parent is not tree.root:
        assert parent.namespace == node.namespace, f"{node!r} namespace differs from parent"
    for tier in (node.device, node.host):
        assert tier is None or tier.numel() == n, f"{node!r} slots do not match its key"
    if node.page_keys is not None:
        assert len(node.page_keys) == n // ps, f"{node!r} has the wrong number of page keys"


def _check_residency(cache: HiRadixCache, node: TreeNode) -> None:
    parent = node.parent
    assert parent is not None
    if node.device is not None and parent is not cache.tree.root:
        assert parent.device is not None, f"inv1: {node!r} on device but its parent is not"
    assert node.device is not None or node.host is not None, f"inv2: {node!r} in no tier"
    if node.backup_op is not None:
        assert node.host is not None and node.device is not None, (
            f"inv3: {node!r} relies on a host copy whose backup is in flight"
        )
        assert node.lock_ref > 0, f"inv3: {node!r} backing up but not locked"
    if node.load_op is not None:
        assert node.device is not None and node.lock_ref > 0, f"inv3: loading {node!r} unlocked"


def _check_locks(cache: HiRadixCache, node: TreeNode) -> None:
    parent = node.parent
    assert parent is not None
    assert node.lock_ref >= 0 and node.host_ref >= 0, f"inv4: negative ref on {node!r}"
    if parent is not cache.tree.root:
        assert parent.lock_ref >= node.lock_ref, f"inv4: {node!r} locked more than its parent"
    if node.lock_ref:
        assert node.device is not None, f"inv4: locked {node!r} is not on device"
    if node.host_ref:
        assert node.host is not None, f"inv4: host-pinned {node!r} has no host copy"


def _check_device_accounting(cache: HiRadixCache, nodes: list[TreeNode]) -> None:
    held = [n.device for n in nodes if n.device is not None]
    tree_held = sum(t.numel() for t in held)
    alloc = cache.device_pool.allocator
    total = alloc.available() + tree_held + cache.request_held_size()
    assert total == alloc.capacity, (
        f"inv5: device free {alloc.available()} + tree {tree_held} + requests "
        f"{cache.request_held_size()} != capacity {alloc.capacity}"
    )
    _assert_disjoint(held, "device")
    locked = sum(len(n.key) for n in nodes if n.device is not None and n.lock_ref)
    assert cache.protected_size() == locked, "inv5: protected_size is off"
    assert cache.evictable_size() == tree_held - locked, "inv5: evictable_size is off"


def _check_host_accounting(cache: HiRadixCache, nodes: list[TreeNode]) -> None:
    held = [n.host for n in nodes if n.host is not None]
    tree_held = sum(t.numel() for t in held)
    pool = cache.host_pool
    assert pool is not None
    alloc = pool.allocator
    total = alloc.available() + tree_held + cache.host_reserved_size()
    assert total == alloc.capacity, (
        f"inv5: host free {alloc.available()} + tree {tree_held} + reserved "
        f"{cache.host_reserved_size()} != capacity {alloc.capacity}"
    )
    _assert_disjoint(held, "host")


def _check_leaves(cache: HiRadixCache, nodes: list[TreeNode]) -> None:
    expected = {
        n for n in nodes if n.device is not None and n.lock_ref == 0 and not n.has_device_child()
    }
    assert cache._leaves == expected, "evictable-leaf set is out of date"


def _assert_disjoint(held: list[torch.Tensor], tier: str) -> None:
    if not held:
        return
    flat = torch.cat(held)
    assert flat.unique().numel() == flat.numel(), f"inv5: a {tier} slot is held twice"
