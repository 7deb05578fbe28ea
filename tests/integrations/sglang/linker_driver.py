"""An SGLang server's cache, built and driven as SGLang's scheduler does, with
``HicacheLinker`` loaded through SGLang's ``dynamic`` linker factory.

``Server`` builds SGLang's real device pool (MHA or MLA), paged allocator,
req-to-token pool and ``UnifiedRadixCache`` (through
``registry.create_unified_radix_cache``, on the Python or the Rust tree core),
then offers the scheduler's steps: ``compute`` (write a request's KV into
fresh slots and insert it: the tree hands the new leaf to the linker),
``settle`` (wait for offloads, then SGLang's ``check_hicache_events``),
``evict``, and ``fetch`` (match a second ``Req``, ``init_load_back``, start the
layer-wise load, read every layer through the pool's own wait hook, then
``finish_external_linker_loads``).
"""

from __future__ import annotations

from array import array
from typing import Any, NamedTuple

import torch

from tests.integrations.sglang.linker_support import SglangModules, TpWorker

PAGE = 4
LAYERS = 3
HEADS, HEAD_DIM = 2, 8  # MHA
LORA, ROPE = 12, 4  # MLA: one latent row of 16 values per token
POOL_TOKENS = 64
MODEL = "org/linker-model"
LINKER = {"linker_module_path": "hicache.integrations.sglang_linker", "linker": "HicacheLinker"}


class Fetched(NamedTuple):
    """What a second request got: its device prefix, the pages loaded for it
    (their slots, empty when none), and whether SGLang aborted it."""

    device_prefix: int
    loaded_slots: torch.Tensor
    aborted: bool
    kv: list[torch.Tensor]  # per layer, per part: the loaded slots' KV (MHA: K, V)


class Server:
    """One SGLang worker's cache with the hicache linker below it."""

    def __init__(
        self,
        sg: SglangModules,
        kind: str,
        core: str,
        extra: dict[str, Any],
        model: str = MODEL,
    ) -> None:
        self.sg, self.kind = sg, kind
        dtype = torch.bfloat16
        if kind == "mha":
            self.kv = sg.memory_pool.MHATokenToKVPool(
                POOL_TOKENS, PAGE, dtype, HEADS, HEAD_DIM, LAYERS, "cpu", False
            )
        else:
            self.kv = sg.memory_pool.MLATokenToKVPool(
                POOL_TOKENS, PAGE, dtype, LORA, ROPE, LAYERS, "cpu", False
            )
        self.alloc = sg.paged.PagedTokenToKVPoolAllocator(
            POOL_TOKENS, PAGE, dtype, "cpu", self.kv, False
        )
        params = sg.cache_init_params.CacheInitParams(
            disable=False,
            req_to_token_pool=sg.memory_pool.ReqToTokenPool(4, 256, "cpu", False),
            token_to_kv_pool_allocator=self.alloc,
            page_size=PAGE,
            tree_core_backend=core,
        )
        self.tp_worker = TpWorker()
        config = {**LINKER, "linker_extra_config": extra}
        # SGLang reads its server args while it runs (get_memory(), get_disagg()):
        # they stay installed until close(); servers close in reverse order.
        self._args = sg.runtime_context.get_context().override_server_args(
            enable_unified_cache_external_linker=True,
            unified_cache_external_linker_backend="dynamic",
            unified_cache_external_linker_config=config,
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
            tp_size=1,
            tp_rank=0,
            tp_group=None,
        )
        try:
            self.cache = sg.registry.create_unified_radix_cache(ctx)
        except BaseException:
            self._args.restore()
            raise
        self.linker = self.cache.linker.cache_linker
        self._rids = 0

    def buffers(self, layer: int) -> list[torch.Tensor]:
        if self.kind == "mha":
            return [self.kv.k_buffer[layer], self.kv.v_buffer[layer]]
        return [self.kv.kv_buffer[layer]]

    def compute(self, tokens: list[int], seed: int) -> list[torch.Tensor]:
        """The forward pass of a request with no cached prefix: its whole pages'
        KV written into fresh slots, then inserted into the tree. Returns the KV
        written, per layer and part."""
        n = len(tokens) // PAGE * PAGE
        slots = self.alloc.alloc(n)
        assert slots is not None, "pool full"
        gen = torch.Generator().manual_seed(seed)
        written = []
        for layer in range(LAYERS):
            for buf in self.buffers(layer):
                values = torch.randn((n, *buf.shape[1:]), generator=gen).to(buf.dtype)
                buf[slots] = values
                written.append(values)
        key = self.sg.radix_cache.RadixKey(array("q", tokens[:n]))
        self.cache.insert(
            self.sg.base_prefix_cache.InsertParams(
                key=key, value=slots.to(torch.int64), prev_prefix_len=0
            )
        )
        return written

    def settle(self) -> None:
        """Wait for the linker's offloads, then let SGLang collect them."""
        assert self.linker.wait_idle(10.0)
        self.cache.check_hicache_events()

    def evict(self) -> None:
        """Evict everything evictable from the device."""
        self.cache.evict(self.sg.base_prefix_cache.EvictParams(num_tokens=POOL_TOKENS))

    def fetch(self, tokens: list[int]) -> Fetched:
        """A new request for ``tokens``: match (asks the linker), load back, the
        forward's per-layer waits, then SGLang's verdict on the load."""
        sg = self.sg
        self._rids += 1
        req = sg.schedule_batch.Req(
            f"req-{self._rids}", "", array("q", tokens), sg.sampling_params.SamplingParams()
        )
        match = self.cache.match_prefix(
            sg.base_prefix_cache.MatchPrefixParams(
                key=sg.radix_cache.RadixKey(array("q", tokens)), req=req
            )
        )
        req.last_node = match.last_device_node
        self.cache.init_load_back(
            sg.base_prefix_cache.InitLoadBackParams(
                best_match_node=match.last_host_node,
                host_hit_length=match.host_hit_length,
                req=req,
            )
        )
        loaded = self.cache.linker.private_load_indices.get(req.rid, torch.empty(0, dtype=torch.int64))
        index = self.cache.ready_to_load_host_cache()
        kv: list[torch.Tensor] = []
        if index >= 0:
            self.kv.layer_transfer_counter.set_consumer(index)
        for layer in range(LAYERS):
            self.kv.get_key_buffer(layer)  # the forward's wait for this layer
            kv += [buf[loaded].clone() for buf in self.buffers(layer)]
        aborted = bool(self.cache.finish_external_linker_loads([req]))
        if len(loaded):
            self.alloc.free(loaded)
        return Fetched(match.device_prefix_len, loaded, aborted, kv)

    def close(self) -> None:
        try:
            self.cache.release_host_resources()
        finally:
            self._args.restore()
