"""SGLang's ``UnifiedRadixCache`` with ``HicacheLinker`` below it, built and driven
as SGLang's scheduler does, on CPU: for the linker's tests and the linker rows
of ``hicache bench sglang --linker``.

``SglangModules`` imports SGLang's tree modules once, with the tree bench's
stand-ins for its GPU/image-only imports (``sglang_trees.unused_imports_stubbed``).
``UnifiedServer`` builds SGLang's real device pool (MHA or MLA), paged
allocator, req-to-token pool and ``UnifiedRadixCache`` through
``registry.create_unified_radix_cache`` with the ``dynamic`` linker factory
(Python or Rust tree core), then offers the scheduler's steps: ``compute``
(write a request's KV into fresh slots and insert it: the tree hands the new
leaf to the linker), ``settle`` (wait for the offloads, then SGLang's
``check_hicache_events``), ``evict``, and ``fetch`` (match a second ``Req``,
``init_load_back``, start the layer-wise load, read every layer through the
pool's own wait hook, then ``finish_external_linker_loads``).

What SGLang needs besides, none of it replacing its logic: server args through
its own ``get_context().override_server_args(...)``, and ``TpWorker``, the two
things ``create_unified_radix_cache`` asks of a tp worker.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import NamedTuple

import torch

from hicache.bench.tree.sglang_trees import unused_imports_stubbed
from hicache.integrations.sglang_cpu import enter_sglang

LINKER = {"linker_module_path": "hicache.integrations.sglang_linker", "linker": "HicacheLinker"}
# SGLang's modules the driver uses; imported once, under the stand-ins.
MODULES = (
    "sglang.srt.mem_cache.registry",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.allocator.paged",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.sampling.sampling_params",
    "sglang.srt.runtime_context",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.unified_cache.linker_factory",
    "sglang.srt.mem_cache.unified_cache.component_type",
    "sglang.srt.mem_cache.utils",
    "hicache.integrations.sglang_linker",
)


class SglangModules:
    """SGLang's modules by their last name (``registry``, ``memory_pool``, ...),
    and which stand-ins their import used (``stood_in``)."""

    def __init__(self) -> None:
        enter_sglang()
        with _without_vllm_stand_ins(), unused_imports_stubbed() as finder:
            self.by_name: dict[str, ModuleType] = {
                name.rsplit(".", 1)[-1]: importlib.import_module(name) for name in MODULES
            }
        self.stood_in = frozenset(finder.used)

    def __getattr__(self, name: str) -> ModuleType:
        try:
            return self.by_name[name]
        except KeyError:
            raise AttributeError(name) from None


@contextlib.contextmanager
def _without_vllm_stand_ins() -> Iterator[None]:
    """Hide the vLLM tests' grammar-engine stand-ins (``hicache.integrations.vllm_cpu``)
    while SGLang is imported: SGLang probes for ``xgrammar`` and would take an empty
    stand-in for the real engine. They are put back as they were."""
    finders = [f for f in sys.meta_path if type(f).__module__.endswith("vllm_cpu")]
    hidden = {
        name: module
        for name, module in sys.modules.items()
        if type(module).__module__.endswith("vllm_cpu")
    }
    for finder in finders:
        sys.meta_path.remove(finder)
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.meta_path.extend(finders)
        sys.modules.update(hidden)


class _ModelRunner:
    forward_stream = None  # CPU: the current stream is the pages' only writer


class TpWorker:
    """What ``create_unified_radix_cache`` reads of its tp worker: the model runner's
    forward stream, and where the layer counter is registered (kept)."""

    def __init__(self) -> None:
        self.model_runner = _ModelRunner()
        self.counter: object = None

    def register_hicache_layer_transfer_counter(self, counter: object) -> None:
        self.counter = counter


@dataclass(frozen=True)
class Shape:
    """The device pool: MHA (``heads`` × ``head_dim`` per K and V) or MLA (one
    latent row of ``head_dim`` values per token), bf16."""

    kind: str = "mha"
    layers: int = 3
    heads: int = 2
    head_dim: int = 8
    page_size: int = 4
    pool_tokens: int = 64


class Fetched(NamedTuple):
    """What a second request got: its device prefix, the slots loaded for it
    (empty when none), whether SGLang aborted it, and the loaded slots' KV per
    layer and part (MHA: K, V; MLA: the latent row)."""

    device_prefix: int
    loaded_slots: torch.Tensor
    aborted: bool
    kv: list[torch.Tensor]


class UnifiedServer:
    """One SGLang worker's cache with the hicache linker below it (see the module doc);
    ``tp_group``: this worker's tensor-parallel group (None: one rank).

    SGLang reads its server args while it runs, so they stay installed until
    ``close()``; servers must be closed in the reverse order of their creation.
    """

    def __init__(
        self,
        sg: SglangModules,
        shape: Shape,
        core: str,
        extra: dict[str, object],
        model: str = "org/linker-model",
        tp_group: torch.distributed.ProcessGroup | None = None,
    ) -> None:
        self.sg, self.shape = sg, shape
        self.kv = self._device_pool()
        self.alloc = sg.paged.PagedTokenToKVPoolAllocator(
            shape.pool_tokens, shape.page_size, torch.bfloat16, "cpu", self.kv, False
        )
        params = sg.cache_init_params.CacheInitParams(
            disable=False,
            req_to_token_pool=sg.memory_pool.ReqToTokenPool(4, 256, "cpu", False),
            token_to_kv_pool_allocator=self.alloc,
            page_size=shape.page_size,
            tree_core_backend=core,
            tp_cache_group=tp_group,  # as SGLang's scheduler passes its TP group (CPU)
            attn_tp_cache_group=tp_group,
        )
        self.tp_worker = TpWorker()
        self._args = sg.runtime_context.get_context().override_server_args(
            enable_unified_cache_external_linker=True,
            unified_cache_external_linker_backend="dynamic",
            unified_cache_external_linker_config={**LINKER, "linker_extra_config": extra},
            served_model_name=model,
        )
        ctx = sg.registry.TreeCacheBuildContext(
            server_args=self._args.install(),
            params=params,
            is_hybrid_swa=False,
            is_hybrid_ssm=False,
            enable_hierarchical_cache=False,
            disable_radix_cache=False,
            tp_worker=self.tp_worker,
            model_config=None,
            tp_size=1 if tp_group is None else torch.distributed.get_world_size(group=tp_group),
            tp_rank=0 if tp_group is None else torch.distributed.get_rank(group=tp_group),
            tp_group=tp_group,
        )
        try:
            self.cache = sg.registry.create_unified_radix_cache(ctx)
        except BaseException:
            self._args.restore()
            raise
        self.linker = self.cache.linker.cache_linker
        self._rids = 0

    def _device_pool(self) -> object:
        s, pools = self.shape, self.sg.memory_pool
        if s.kind == "mha":
            return pools.MHATokenToKVPool(
                s.pool_tokens, s.page_size, torch.bfloat16, s.heads, s.head_dim, s.layers,
                "cpu", False,
            )  # fmt: skip
        rope = s.head_dim // 4
        return pools.MLATokenToKVPool(
            s.pool_tokens, s.page_size, torch.bfloat16, s.head_dim - rope, rope, s.layers,
            "cpu", False,
        )  # fmt: skip

    def buffers(self, layer: int) -> list[torch.Tensor]:
        """The device pool's tensors of one layer (MHA: K, V; MLA: the latent buffer)."""
        if self.shape.kind == "mha":
            return [self.kv.k_buffer[layer], self.kv.v_buffer[layer]]  # type: ignore[attr-defined]
        return [self.kv.kv_buffer[layer]]  # type: ignore[attr-defined]

    def compute(self, tokens: list[int], seed: int) -> list[torch.Tensor]:
        """A forward pass with no cached prefix: the whole pages' KV written into
        fresh slots, then inserted into the tree. Returns the KV written, per
        layer and part."""
        n = len(tokens) // self.shape.page_size * self.shape.page_size
        slots, written = self.write(n, seed)
        self.insert(tokens[:n], slots)
        return written

    def write(self, n: int, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``n`` fresh slots filled with seeded KV (the forward's writes): the slots,
        and the KV per layer and part."""
        slots = self.alloc.alloc(n)
        if slots is None:
            raise RuntimeError(f"device pool full ({n} slots asked)")
        gen = torch.Generator().manual_seed(seed)
        written = []
        for layer in range(self.shape.layers):
            for buf in self.buffers(layer):
                values = torch.randn((n, *buf.shape[1:]), generator=gen).to(buf.dtype)
                buf[slots] = values
                written.append(values)
        return slots, written

    def insert(self, tokens: list[int], slots: torch.Tensor) -> None:
        """Insert whole pages whose KV is in ``slots`` (the tree offloads new leaves)."""
        sg = self.sg
        key = sg.radix_cache.RadixKey(array("q", tokens))
        self.cache.insert(
            sg.base_prefix_cache.InsertParams(
                key=key, value=slots.to(torch.int64), prev_prefix_len=0
            )
        )

    def settle(self, timeout_s: float = 30.0) -> None:
        """Wait for the linker's offloads, then let SGLang collect them."""
        if not self.linker.wait_idle(timeout_s):
            raise TimeoutError(f"offloads still running after {timeout_s} s")
        self.cache.check_hicache_events()

    def evict(self) -> None:
        """Evict everything evictable from the device."""
        num_tokens = self.shape.pool_tokens
        self.cache.evict(self.sg.base_prefix_cache.EvictParams(num_tokens=num_tokens))

    def fetch(self, tokens: list[int], keep: bool = True) -> Fetched:
        """A new request for ``tokens``: match (asks the linker), load back, the
        forward's per-layer waits, then SGLang's verdict on the load. The loaded
        slots are freed afterwards; ``keep=False`` skips copying their KV out."""
        sg = self.sg
        self._rids += 1
        req = sg.schedule_batch.Req(
            f"req-{self._rids}", "", array("q", tokens), sg.sampling_params.SamplingParams()
        )
        key = sg.radix_cache.RadixKey(array("q", tokens))
        match = self.cache.match_prefix(sg.base_prefix_cache.MatchPrefixParams(key=key, req=req))
        req.last_node = match.last_device_node
        self.cache.init_load_back(
            sg.base_prefix_cache.InitLoadBackParams(
                best_match_node=match.last_host_node, host_hit_length=match.host_hit_length, req=req
            )
        )
        none = torch.empty(0, dtype=torch.int64)
        loaded: torch.Tensor = self.cache.linker.private_load_indices.get(req.rid, none)
        index = self.cache.ready_to_load_host_cache()
        if index >= 0:
            self.kv.layer_transfer_counter.set_consumer(index)  # type: ignore[attr-defined]
        kv: list[torch.Tensor] = []
        for layer in range(self.shape.layers):
            self.kv.get_key_buffer(layer)  # type: ignore[attr-defined]  # the forward's wait
            if keep:
                kv += [buf[loaded].clone() for buf in self.buffers(layer)]
        aborted = bool(self.cache.finish_external_linker_loads([req]))
        if len(loaded):
            self.alloc.free(loaded)
        return Fetched(int(match.device_prefix_len), loaded, aborted, kv)

    def close(self) -> None:
        """Close the linker (through SGLang) and restore the server args."""
        try:
            self.cache.release_host_resources()
        finally:
            self._args.restore()
