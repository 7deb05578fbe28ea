"""Typed records that the cache's parts return and only the façade routes.

Parts never call each other: a part's ``poll()`` (and a few of its methods)
return these, and ``HiRadixCache`` applies each to the parts concerned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from hicache.events.kv import BlockStored
from hicache.policies.prefetch import StoragePlan
from hicache.policies.prefetch_cost import LoadChoice
from hicache.tree.radix_tree import Key, TreeNode
from transfer.storage_io import OpTiming, ReadProgress


class BackupDone(NamedTuple):
    """A D2H backup finished. ``nodes``: ``node`` and the ancestors split off it
    that shared the copy. On failure the host tier already dropped their host
    slots; either way the backup's lock on ``node`` is to be released."""

    node: TreeNode
    nodes: tuple[TreeNode, ...]
    ok: bool
    nbytes: int
    error: str | None
    seconds: float = 0.0  # D2H submitted -> completion taken by the owner


class LoadDone(NamedTuple):
    """An H2D load-back landed; its lock on ``node`` is to be released."""

    node: TreeNode
    nodes: tuple[TreeNode, ...]
    nbytes: int
    seconds: float = 0.0  # H2D submitted -> completion taken by the owner
    copy_s: float = 0.0  # the copy itself, as the transfer engine timed it (0: not timed)


class LoadFailed(NamedTuple):
    """An H2D load-back failed: the device copies of ``nodes`` are unusable."""

    node: TreeNode
    nodes: tuple[TreeNode, ...]
    error: str | None


class Dropped(NamedTuple):
    """A tier's copy of ``node`` was freed. ``deleted``: the node left the tree.
    ``announced``: its copy had been announced in a KV event (withdraw it)."""

    node: TreeNode
    deleted: bool
    announced: bool = True


class PutDone(NamedTuple):
    """A storage write finished: release host pin ``pin``; ``event`` (built when
    the put started) announces the first ``stored_pages`` pages."""

    job_id: int
    pin: int
    event: BlockStored | None
    stored_pages: int
    ok: bool
    nbytes: int
    timings: tuple[OpTiming, ...] = ()  # the backend calls the job made


@dataclass
class PrefetchState:
    """A storage prefetch (lookup then get) for one request. Owned by the
    storage tier; the façade reads it when routing ``PrefetchDone``, and
    when the request goes on before it is done: the first ``taken`` tokens
    of ``host_slots`` (pages that had arrived) then went to the tree, and
    ``cut`` says the rest of the read was stopped."""

    request_id: str
    key: Key
    namespace: str | None
    start: int  # tokens before the first page looked up
    keys: list[bytes]  # page keys past ``start``, computed once for the request
    host_slots: torch.Tensor  # reserved for every key; the unused part is freed
    job_id: int
    pin_id: int
    started: float
    plan: StoragePlan
    progress: ReadProgress
    fetched: int = 0
    done: bool = False
    released: bool = False
    taken: int = 0
    cut: bool = False
    choice: LoadChoice | None = None  # the plan's, once the lookup is done


class Arrived(NamedTuple):
    """A request went on before its prefetch was done: tokens ``[lo, hi)`` of
    ``state.host_slots`` had arrived and go to the tree now. ``cut``: the
    rest of the read was stopped; it moved ``nbytes`` in ``seconds``."""

    state: PrefetchState
    lo: int
    hi: int
    cut: bool
    nbytes: int
    seconds: float


class PrefetchDone(NamedTuple):
    """A prefetch job finished: storage held ``found_pages`` leading pages and
    ``fetched_pages`` of them are now in ``state.host_slots`` (0 when fewer than
    the prefetch threshold were found, or the get failed)."""

    state: PrefetchState
    found_pages: int
    fetched_pages: int
    nbytes: int
    ok: bool
    timings: tuple[OpTiming, ...] = ()  # the backend calls the job made
    planned_pages: int = 0  # of the found pages, those the plan chose to read

    @property
    def read(self) -> tuple[int, float] | None:
        """Bytes its gets moved and the seconds they took (None: no get)."""
        gets = [t for t in self.timings if t.op == "get"]
        return (sum(t.nbytes for t in gets), sum(t.seconds for t in gets)) if gets else None


class LookupDone(NamedTuple):
    """An ``exists`` lookup for ``match_prefix(with_storage=True)`` finished."""

    first_key: bytes
    found_pages: int
    timings: tuple[OpTiming, ...] = ()  # the backend calls the job made


class StorageRemoved(NamedTuple):
    """Page keys the backend evicted, deleted or dropped as damaged."""

    keys: tuple[bytes, ...]


class WaitTimedOut(NamedTuple):
    """A wait for storage job ``job_id`` gave up after ``storage.timeout_s``;
    the job stays in flight and lands in a later poll."""

    job_id: int


# Every record a part hands the façade to route.
Record = (
    BackupDone
    | LoadDone
    | LoadFailed
    | PutDone
    | PrefetchDone
    | LookupDone
    | StorageRemoved
    | WaitTimedOut
)
