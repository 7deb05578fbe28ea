"""The state HiRadixCache's mixins share, declared once, and the cache's error type."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from device_pool import DeviceKVPool
from hicache.config import CacheConfig, PolicyConfig
from hicache.events import BlockStored, EventSink
from hicache.metrics import CacheMetrics
from hicache.radix_tree import Key, RadixTree, TreeNode
from host_pool import HostKVPool
from transfer import TransferEngine
from transfer.storage_io import StorageIO


class CacheError(ValueError):
    """A call the cache refuses: bad node, bad lock, bad slots. Nothing was changed."""


@dataclass
class PrefetchState:
    """A storage prefetch in flight for one request (owner thread only)."""

    request_id: str
    key: Key
    namespace: str | None
    start: int  # tokens before the first fetched page
    keys: list[bytes]
    host_slots: torch.Tensor
    job_id: int
    pin_id: int
    started: float
    fetched: int = 0
    done: bool = False


class CacheState:
    """Attributes of a HiRadixCache; ``HiRadixCache.__init__`` sets them all.

    Only the owner thread reads or writes them.
    """

    config: CacheConfig
    page_size: int
    device_pool: DeviceKVPool
    host_pool: HostKVPool | None
    transfer: TransferEngine | None
    storage: StorageIO | None
    tree: RadixTree
    fingerprint: bytes
    metrics: CacheMetrics
    events: EventSink | None
    _policy: PolicyConfig
    _evictable: int  # device tokens of unlocked nodes
    _protected: int  # device tokens of locked nodes
    _request_held: int  # device slots handed to requests, not in the tree
    _leaves: set[TreeNode]  # unlocked device nodes with no device child
    _backups: dict[int, TreeNode]  # D2H op id -> deepest node being backed up
    _loads: dict[int, TreeNode]  # H2D op id -> deepest node being loaded
    _queued_loads: set[int]  # H2D ops submitted since the last start_loading()
    _launched_early: set[int]  # queued ops drain() launched before start_loading()
    _batch_loads: set[int]  # H2D ops the current forward batch reads
    _failed_loads: set[int]  # failed H2D ops of the current batch
    _bad_device: set[TreeNode]  # failed loads: device bytes unusable
    _pins: dict[int, list[TreeNode]]  # pin id -> nodes whose host_ref it holds
    _next_pin: int
    _puts: dict[int, tuple[int, BlockStored | None]]  # storage job -> (pin id, event)
    _prefetches: dict[str, PrefetchState]  # request id -> prefetch
    _prefetch_jobs: dict[int, PrefetchState]  # storage job -> prefetch


def empty_slots() -> torch.Tensor:
    """A fresh empty int64 slot tensor."""
    return torch.empty(0, dtype=torch.int64)
