"""Eviction policies: which unlocked leaf goes first. Small objects by name.

A policy maps a node to a sort key; the smallest key is evicted first. The
registry ``EVICTION_POLICIES`` is the one list of names: config validation,
the CLI help and the tests all read it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from hicache.policies.registry import create_policy

if TYPE_CHECKING:
    from hicache.tree.radix_tree import TreeNode


class EvictionPolicy(Protocol):
    """Orders eviction candidates; pure (reads the node, mutates nothing)."""

    def sort_key(self, node: TreeNode) -> tuple[int, int]:
        """Smaller is evicted first."""
        ...


class LRU:
    """Least recently used first."""

    def sort_key(self, node: TreeNode) -> tuple[int, int]:
        return (node.last_access, node.id)


class LFU:
    """Least frequently used first; ties broken by recency."""

    def sort_key(self, node: TreeNode) -> tuple[int, int]:
        return (node.hit_count, node.last_access)


class FIFO:
    """Oldest inserted first, whatever its use since."""

    def sort_key(self, node: TreeNode) -> tuple[int, int]:
        return (node.created, node.id)


class Priority:
    """Lowest request priority first (a node keeps the highest priority of
    the requests that inserted or hit it); ties broken by recency."""

    def sort_key(self, node: TreeNode) -> tuple[int, int]:
        return (node.priority, node.last_access)


EVICTION_POLICIES: dict[str, Callable[[], EvictionPolicy]] = {
    "lru": LRU,
    "lfu": LFU,
    "fifo": FIFO,
    "priority": Priority,
}


def create_eviction_policy(name: str) -> EvictionPolicy:
    """The policy named ``name``; ValueError naming the known ones otherwise."""
    return create_policy(EVICTION_POLICIES, name, "eviction")
