"""Write policies (device → host backups): small objects by name.

``WRITE_POLICIES`` is the one list of names that config validation, the CLI
help and the tests read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from hicache.policies.registry import create_policy


class WritePolicy(Protocol):
    """When a device node gets a host copy. Pure: decides, mutates nothing."""

    on_insert: bool  # back up every newly inserted node
    on_evict: bool  # back up a leaf that is evicted without a host copy

    def on_hit(self, hit_count: int, threshold: int) -> bool:
        """Back up a device node that a match just hit ``hit_count`` times."""
        ...


class WriteThrough:
    """Back up every new node at once."""

    on_insert, on_evict = True, False

    def on_hit(self, hit_count: int, threshold: int) -> bool:
        return False


class WriteThroughSelective:
    """Back up a node once it has been hit ``write_through_threshold`` times."""

    on_insert, on_evict = False, False

    def on_hit(self, hit_count: int, threshold: int) -> bool:
        return hit_count >= threshold


class WriteBack:
    """Back up only what eviction would otherwise delete."""

    on_insert, on_evict = False, True

    def on_hit(self, hit_count: int, threshold: int) -> bool:
        return False


WRITE_POLICIES: dict[str, Callable[[], WritePolicy]] = {
    "write_through": WriteThrough,
    "write_through_selective": WriteThroughSelective,
    "write_back": WriteBack,
}


def create_write_policy(name: str) -> WritePolicy:
    """The policy named ``name``; ValueError naming the known ones otherwise."""
    return create_policy(WRITE_POLICIES, name, "write")
