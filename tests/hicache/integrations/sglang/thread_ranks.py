"""Tensor-parallel ranks as threads of one process, for the linker's TP tests.

SGLang's ``UnifiedRadixCache`` runs one scheduler per TP rank, in lockstep, and
reduces what the ranks must agree on over its TP group (``torch.distributed``:
which prefix every rank can restore, whether a load landed everywhere). Two real
processes with a gloo group would each import SGLang (tens of seconds on the CI
machine), so here each rank is a thread and ``ThreadGroup`` stands in for the
process group: ``torch.distributed``'s ``is_initialized``, ``get_rank``,
``get_world_size`` and ``all_reduce`` are patched (``patch_distributed``) to answer
for a ``RankGroup`` (one rank's handle on the group) and to meet the other ranks'
calls at a barrier; every other call goes to torch as before. Every wait is bounded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import pytest
import torch
import torch.distributed as dist

_BOUND_S = 60.0
_R = TypeVar("_R")


class ThreadGroup:
    """``size`` ranks, one thread each, reducing tensors together."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._barrier = threading.Barrier(size, timeout=_BOUND_S)
        self._slots: list[torch.Tensor | None] = [None] * size
        self._result: torch.Tensor | None = None

    def rank(self, rank: int) -> RankGroup:
        return RankGroup(self, rank)

    def all_reduce(self, rank: int, tensor: torch.Tensor, op: object) -> None:
        self._slots[rank] = tensor.clone()
        if self._barrier.wait() == 0:  # every rank's tensor is in: one of them reduces
            stacked = torch.stack([t for t in self._slots if t is not None])
            if op == dist.ReduceOp.MIN:
                self._result = stacked.min(dim=0).values
            elif op == dist.ReduceOp.MAX:
                self._result = stacked.max(dim=0).values
            elif op == dist.ReduceOp.SUM:
                self._result = stacked.sum(dim=0).to(tensor.dtype)
            else:
                raise NotImplementedError(f"all_reduce op {op}")
        self._barrier.wait()
        assert self._result is not None
        tensor.copy_(self._result)
        self._barrier.wait()  # every rank has its copy before the next round's writes

    def barrier(self) -> None:
        """Wait until every rank got here (the lockstep of SGLang's schedulers)."""
        self._barrier.wait()

    def run(self, work: Callable[[int], _R]) -> list[_R]:
        """``work(rank)`` on one thread per rank; the results by rank (a failure on any
        rank is raised here, after every thread ended)."""
        results: list[_R | None] = [None] * self.size
        errors: list[BaseException] = []

        def one(rank: int) -> None:
            try:
                results[rank] = work(rank)
            except BaseException as exc:
                errors.append(exc)
                self._barrier.abort()  # the other ranks stop waiting for this one

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(_BOUND_S * 4)
        assert not any(t.is_alive() for t in threads), "a rank is still running"
        if errors:
            raise errors[0]
        return results  # type: ignore[return-value]


class RankGroup:
    """One rank's handle on a ``ThreadGroup``: what SGLang holds as its TP group."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank = group, rank


def patch_distributed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.distributed`` answers for ``RankGroup`` handles (others as before)."""
    real_rank, real_size, real_reduce = dist.get_rank, dist.get_world_size, dist.all_reduce

    def get_rank(group: object = None) -> int:
        return group.rank if isinstance(group, RankGroup) else real_rank(group)  # type: ignore[arg-type]

    def get_world_size(group: object = None) -> int:
        return group.group.size if isinstance(group, RankGroup) else real_size(group)  # type: ignore[arg-type]

    def all_reduce(
        tensor: torch.Tensor, op: object = dist.ReduceOp.SUM, group: object = None, **more: object
    ) -> None:
        if not isinstance(group, RankGroup):
            return real_reduce(tensor, op=op, group=group, **more)  # type: ignore[arg-type]
        group.group.all_reduce(group.rank, tensor, op)
        return None

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", get_rank)
    monkeypatch.setattr(dist, "get_world_size", get_world_size)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
