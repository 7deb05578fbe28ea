"""Results returned by HiRadixCache: named, immutable, no sentinels."""

from __future__ import annotations

from typing import NamedTuple

import torch

from hicache.tree.radix_tree import Key, TreeNode


class MatchResult(NamedTuple):
    """What ``match_prefix`` found.

    ``device_indices`` are the device slots of the device-resident prefix (a
    fresh tensor); ``last_device_node`` ends that prefix (lock it before use).
    ``last_host_node`` ends the longer prefix that also counts host-only nodes,
    ``host_hit_length`` tokens past the device prefix. ``storage_hit_length``
    counts tokens past both that storage holds, as found by the last completed
    lookup of those pages (0 unless asked for, or while the first lookup runs
    on the storage workers: ``match_prefix`` never calls the backend).
    ``key`` is the request's tokens, checked and converted once (a
    ``TokenKey``): pass it, or ``extend_key(key, generated)`` (which checks
    only the new ids), back to ``cache_*_req``.
    """

    device_indices: torch.Tensor
    last_device_node: TreeNode
    last_host_node: TreeNode
    host_hit_length: int
    storage_hit_length: int = 0
    key: Key | None = None

    @property
    def device_hit_length(self) -> int:
        return int(self.device_indices.numel())


class InsertResult(NamedTuple):
    """``prefix_len`` tokens were already cached (any tier); ``last_node`` ends
    the insert; the tree now holds the request's first ``inserted_len`` tokens.
    ``inserted_len`` is short of the whole pages only when the path runs into
    a node whose load-back failed: slots past it stay the caller's."""

    prefix_len: int
    last_node: TreeNode
    inserted_len: int


class UnfinishedResult(NamedTuple):
    """After ``cache_unfinished_req``: the tree's slots for the request's cached
    prefix (replace the request's own, some of which were freed as duplicates),
    and the new last node, now locked for the request."""

    device_indices: torch.Tensor
    last_node: TreeNode
    prefix_len: int


class EvictResult(NamedTuple):
    """Device tokens freed by ``evict``: deleted nodes plus nodes demoted to host."""

    freed: int
    demoted: int
    deleted: int


class LoadBackResult(NamedTuple):
    """``init_load_back``: device slots now assigned to the loaded host nodes (in
    prefix order, appended after the match's ``device_indices``), the deepest
    node now on device, and how many tokens are being loaded (0 = nothing)."""

    device_indices: torch.Tensor
    last_node: TreeNode
    loaded_tokens: int


class PollResult(NamedTuple):
    """Completions applied by one ``poll()``."""

    backups: int
    loads: int
    failures: int

    @property
    def total(self) -> int:
        return self.backups + self.loads + self.failures


class PrefetchStatus(NamedTuple):
    """``check_prefetch``: may the request proceed (``ready``, per the prefetch
    policy), has the fetch finished and been inserted (``done``), how many
    tokens were fetched so far out of how many asked for, and, while not
    ready, how long the policy may still wait for it (``wait_s``)."""

    ready: bool
    done: bool
    fetched_tokens: int
    total_tokens: int
    wait_s: float = 0.0


class AdmitResult(NamedTuple):
    """``admit``: the device slots of the request's usable prefix (device hit,
    then tokens loaded back from host), the node that ends it (locked for the
    request), and how many of its tokens are being loaded back."""

    device_indices: torch.Tensor
    last_node: TreeNode
    loaded_tokens: int


class DeviceShortfall(NamedTuple):
    """What holds the device pool when an allocation of ``needed`` tokens fails."""

    needed: int
    free: int
    locked: int  # tree tokens pinned by requests' locks (and backups/loads in flight)
    request_held: int  # handed out by alloc_device, not yet inserted or freed
    evictable: int  # unlocked tree tokens eviction could not reach or free
    host_pinned: int  # host tokens pinned by storage jobs (they block write-backs)

    def __str__(self) -> str:
        return (
            f"need {self.needed} device tokens, {self.free} free; {self.locked} locked, "
            f"{self.request_held} held by requests, {self.evictable} evictable but blocked "
            f"({self.host_pinned} host tokens pinned by storage jobs)"
        )
