"""vLLM's offloading modules on a CPU machine: for the tier's tests and ``hicache bench vllm``.

``make test`` installs vLLM's wheel ``--no-deps`` plus the light packages its
offloading modules import (requirements/engine-deps.txt). Two of those
imports are grammar engines for structured output, compiled packages that
the offloading path never calls: ``vllm.config`` reaches ``xgrammar`` and
``llguidance`` at module level through its structured-output imports.
``enter_vllm()`` stands in an empty module for each of them *only when it is
not installed*, so ``import vllm.v1.kv_offload.tiering...`` works; every
vLLM module still comes from the installed wheel, unchanged. On a vLLM server
(vLLM fully installed) nothing is stood in.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import mmap
import sys
import threading
import time
import types
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import LookupResult, OffloadKey
    from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

# Grammar engines vLLM imports at module level and the offloading path never uses.
STAND_INS = ("xgrammar", "llguidance")


class _StandIn(types.ModuleType):
    """An empty package whose every attribute is an empty placeholder class, so
    that ``from xgrammar.structural_tag import StructuralTag`` imports (vLLM
    even builds a few such objects at module level)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__module__": self.__name__})


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the stand-in's submodules (``xgrammar.structural_tag``)."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self._roots = roots

    def find_spec(
        self,
        name: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] not in self._roots:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StandIn(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def enter_vllm() -> tuple[str, ...]:
    """Stand in for the missing grammar engines; return the names stood in for."""
    missing = tuple(
        name
        for name in STAND_INS
        if name not in sys.modules and importlib.util.find_spec(name) is None
    )
    if missing and not any(isinstance(f, _StandInFinder) for f in sys.meta_path):
        sys.meta_path.append(_StandInFinder(missing))
    return missing


# --- a CPU stand-in for what vLLM's scheduler builds around its tiers ---------------------


class PrimaryBuffer:
    """A primary tier's KV memory as vLLM hands it to secondary tiers: a
    page-aligned (mmap) buffer viewed as ``(num_chunks, chunk_bytes)`` bytes,
    so that ``view.strides[0]`` is the chunk size (O_DIRECT in vLLM's ``fs``
    tier needs the alignment)."""

    def __init__(self, num_chunks: int, chunk_bytes: int) -> None:
        self._map = mmap.mmap(-1, num_chunks * chunk_bytes)
        self.array = np.frombuffer(self._map, dtype=np.uint8).reshape(num_chunks, chunk_bytes)
        self.view = memoryview(self._map).cast("B", [num_chunks, chunk_bytes])

    def chunk(self, index: int) -> bytes:
        """A copy of chunk ``index``'s bytes."""
        return self.array[index].tobytes()

    def fill(self, index: int, data: bytes) -> None:
        """Overwrite chunk ``index`` with ``data`` (exactly one chunk)."""
        self.array[index] = np.frombuffer(data, dtype=np.uint8)


def cpu_offloading_spec(
    chunk_bytes: int,
    num_chunks: int,
    secondary_tiers: list[dict[str, object]] | None = None,
    model: str = "org/model",
    engine_id: str = "hicache-cpu",
    tokens_per_block: int = 16,
    kv_events: bool = False,
) -> TieringOffloadingSpec:
    """vLLM's ``TieringOffloadingSpec`` for one worker and one KV group, with a
    CPU primary tier of ``num_chunks`` chunks of ``chunk_bytes`` (a multiple of
    the page size, so vLLM adds no padding), as its connector builds it."""
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block, ("layer.0", "layer.1"), 0),),
        worker_kv_bytes_per_block=chunk_bytes,
        enable_kv_cache_events=kv_events,
        extra_config={
            "cpu_bytes_to_use": num_chunks * chunk_bytes,
            "secondary_tiers": secondary_tiers or [],
        },
        engine_id=engine_id,
        model=OffloadingModelConfig(name=model, dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=tokens_per_block, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )
    return TieringOffloadingSpec(config)


def create_tier(
    tier_config: dict[str, object], primary: PrimaryBuffer, spec: TieringOffloadingSpec
) -> SecondaryTierManager:
    """A secondary tier built by vLLM's ``SecondaryTierFactory``, as vLLM builds it."""
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    return SecondaryTierFactory.create_secondary_tier(dict(tier_config), primary.view, spec)


class TierDriver:
    """Drives one secondary tier the way vLLM's tiering manager does, and waits
    (bounded) for answers: jobs are submitted, then ``get_finished_jobs`` is
    polled; lookups are repeated across ``on_schedule_end`` while RETRY."""

    def __init__(self, tier: SecondaryTierManager, timeout_s: float = 20.0) -> None:
        self.tier = tier
        self.timeout_s = timeout_s
        self._ids = itertools.count(1)
        self._pause = threading.Event()

    def jobs(
        self, batches: Iterable[tuple[Sequence[OffloadKey], Sequence[int]]], promotion: bool
    ) -> list[JobResult]:
        """Submit one store (or load, ``promotion``) job per (keys, chunk ids)
        batch, then collect every result; in submission order."""
        from vllm.v1.kv_offload.base import ReqContext
        from vllm.v1.kv_offload.tiering.base import TransferJob

        submit = self.tier.submit_load if promotion else self.tier.submit_store
        context = ReqContext(req_id=f"driver-{next(self._ids)}")
        ids = []
        for keys, chunks in batches:
            job_id = next(self._ids)
            ids.append(job_id)
            submit(TransferJob(job_id, list(keys), np.array(chunks, np.int64), promotion, context))
        return self._collect(ids)

    def _collect(self, ids: list[int]) -> list[JobResult]:
        results: dict[int, JobResult] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(results) < len(ids):
            for result in self.tier.get_finished_jobs():
                results[result.job_id] = result
            if len(results) < len(ids):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{len(ids) - len(results)} jobs did not finish")
                self._pause.wait(0.0002)
        return [results[i] for i in ids]

    def lookup(self, keys: Sequence[OffloadKey]) -> list[LookupResult]:
        """Each key's final answer (HIT or MISS) for a fresh request."""
        from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext

        context = ReqContext(req_id=f"lookup-{next(self._ids)}")
        self.tier.on_new_request(context)
        deadline = time.monotonic() + self.timeout_s
        answers = [self.tier.lookup(k, context) for k in keys]
        while LookupResult.RETRY in answers:
            if time.monotonic() > deadline:
                raise TimeoutError("lookups stayed RETRY")
            self.tier.on_schedule_end(ScheduleEndContext((), ()))
            self._pause.wait(0.0005)
            answers = [self.tier.lookup(k, context) for k in keys]
        self.tier.on_request_finished(context)
        return answers
