"""Structural invariants of DESIGN §3 over a tree, node by node.

``HiRadixCache.check_integrity()`` runs these and then each part's own
``check()`` (accounting, slot ownership, leaf set, pins, prefetch tables).
"""

from __future__ import annotations

from hicache.tree.radix_tree import RadixTree, TreeNode


def check_tree(tree: RadixTree, page_size: int) -> None:
    """Raise AssertionError naming the first broken invariant."""
    for node in tree.nodes():
        _check_node_shape(tree, page_size, node)
        _check_residency(tree, node)
        _check_locks(tree, node)


def _check_node_shape(tree: RadixTree, ps: int, node: TreeNode) -> None:
    n = len(node.key)
    assert n > 0 and n % ps == 0, f"inv6: {node!r} key length {n} is not whole pages"
    parent = node.parent
    assert parent is not None and node.tree is tree, f"{node!r} is detached but reachable"
    ckey = tree.child_key(parent, node.key, 0, node.namespace)
    assert parent.children.get(ckey) is node, f"inv6: {node!r} is not under its first page"
    if parent is not tree.root:
        assert parent.namespace == node.namespace, f"{node!r} namespace differs from parent"
    assert node.dev is None or node.dev.size == n, f"{node!r} device slots do not match its key"
    assert node.host is None or node.host.numel() == n, f"{node!r} host slots do not match its key"
    if node.page_keys is not None:
        assert len(node.page_keys) == n // ps, f"{node!r} has the wrong number of page keys"


def _check_residency(tree: RadixTree, node: TreeNode) -> None:
    parent = node.parent
    assert parent is not None
    if node.dev is not None and parent is not tree.root:
        assert parent.dev is not None, f"inv1: {node!r} on device but its parent is not"
    assert node.dev is not None or node.host is not None, f"inv2: {node!r} in no tier"
    if node.backup_op is not None:
        assert node.host is not None and node.dev is not None, (
            f"inv3: {node!r} relies on a host copy whose backup is in flight"
        )
        assert node.lock_ref > 0, f"inv3: {node!r} backing up but not locked"
    if node.load_op is not None:
        assert node.dev is not None and node.lock_ref > 0, f"inv3: loading {node!r} unlocked"


def _check_locks(tree: RadixTree, node: TreeNode) -> None:
    parent = node.parent
    assert parent is not None
    assert node.lock_ref >= 0 and node.host_ref >= 0, f"inv4: negative ref on {node!r}"
    if parent is not tree.root:
        assert parent.lock_ref >= node.lock_ref, f"inv4: {node!r} locked more than its parent"
    if node.lock_ref:
        assert node.dev is not None, f"inv4: locked {node!r} is not on device"
    if node.host_ref:
        assert node.host is not None, f"inv4: host-pinned {node!r} has no host copy"
