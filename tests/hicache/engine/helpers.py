"""Builders shared by the engine tests: tiny models, configs, chats, checked runs."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hicache.cache import HiRadixCache
from hicache.config.cache import CacheConfig, DeviceConfig, HostConfig, ModelConfig, PolicyConfig
from hicache.engine import Engine, EngineOptions, ModelSpec, Request, RequestOutput, TinyLlama
from storage_backends import StorageConfig

SPEC = ModelSpec(
    num_layers=2,
    num_heads=4,
    kv_heads=2,
    head_dim=16,
    hidden=64,
    intermediate=128,
    vocab=256,
    attention_block=16,
)
# The same model with DeepSeek-style latent attention (one latent per token and layer).
MLA = dataclasses.replace(
    SPEC, attention="mla", kv_heads=1, head_dim=16, kv_lora_rank=24, rope_dim=8
)
SPECS = [pytest.param(SPEC, id="mha"), pytest.param(MLA, id="mla")]


def config(
    page_size: int,
    device_tokens: int,
    host: bool = False,
    store: Path | None = None,
    prefetch_policy: str = "wait_complete",
    spec: ModelSpec = SPEC,
    device: str = "cpu",
    layout: str = "layer_first",
) -> CacheConfig:
    """A cache for ``spec`` on ``device``; host tier (ratio 4, ``layout``) and
    LMDB storage on request."""
    storage = StorageConfig()
    if store is not None:
        storage = StorageConfig(backend="lmdb", path=str(store), max_bytes=64 << 20, sync=False)
    return CacheConfig(
        model=ModelConfig(
            num_layers=spec.num_layers,
            kv_heads=spec.kv_heads,
            head_dim=spec.head_dim,
            dtype=spec.dtype,
            attention=spec.attention,
            kv_lora_rank=spec.kv_lora_rank,
            rope_dim=spec.rope_dim,
        ),
        device=DeviceConfig(device=device, page_size=page_size, num_tokens=device_tokens),
        host=HostConfig(
            enabled=host or store is not None, ratio=4.0, reserve_gb=0.0, layout=layout
        ),
        policy=PolicyConfig(
            load_back_threshold=1, prefetch_threshold=1, prefetch_policy=prefetch_policy
        ),
        storage=storage,
    )


def engine(
    cfg: CacheConfig, use_cache: bool = True, chunk_size: int = 64, spec: ModelSpec = SPEC
) -> Engine:
    options = EngineOptions(use_cache=use_cache, chunk_size=chunk_size)
    cache = HiRadixCache(cfg)
    return Engine(TinyLlama(spec, cache.device_pool.device), cache, options)


def reference(
    page_size: int = 1, chunk_size: int = 64, spec: ModelSpec = SPEC, device: str = "cpu"
) -> Engine:
    """The same model with caching disabled and a roomy device-only pool."""
    cfg = config(page_size, 4096, spec=spec, device=device)
    return engine(cfg, use_cache=False, chunk_size=chunk_size, spec=spec)


def tokens(rng: random.Random, n: int, vocab: int = SPEC.vocab) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def run_checked(eng: Engine) -> list[RequestOutput]:
    """Run to completion, checking every cache invariant after each tick."""
    done: list[RequestOutput] = []
    while not eng.is_idle():
        done.extend(eng.step())
        eng.cache.check_integrity()
    return done


def generate(eng: Engine, requests: list[Request]) -> list[RequestOutput]:
    for request in requests:
        eng.submit(request)
    by_id = {out.request_id: out for out in run_checked(eng)}
    return [by_id[r.request_id] for r in requests]


def chat(
    eng: Engine,
    user_turns: list[list[int]],
    max_new_tokens: int = 4,
    between: Callable[[HiRadixCache], None] | None = None,
    namespace: str | None = None,
) -> list[RequestOutput]:
    """A multi-turn chat: each prompt is the whole history plus the next user turn."""
    history: list[int] = []
    outs: list[RequestOutput] = []
    for i, turn in enumerate(user_turns):
        history += turn
        req = Request(f"turn{i}", tuple(history), max_new_tokens, namespace)
        outs += generate(eng, [req])
        history += list(outs[-1].output_tokens)
        if between is not None:
            between(eng.cache)
    return outs


def assert_same(got: list[RequestOutput], want: list[RequestOutput]) -> None:
    """Bit-identical greedy tokens and final logits."""
    for g, w in zip(got, want, strict=True):
        assert g.output_tokens == w.output_tokens, f"{g.request_id}: tokens differ"
        assert torch.equal(g.final_logits, w.final_logits), (
            f"{g.request_id}: logits differ by {(g.final_logits - w.final_logits).abs().max()}"
        )


def assert_clean(cache: HiRadixCache) -> None:
    """Nothing locked or held by requests; every device slot free after a full eviction."""
    cache.drain()
    cache.check_integrity()
    assert cache.protected_size() == 0
    assert cache.request_held_size() == 0
    cache.evict(10**9)
    cache.check_integrity()
    assert cache.device_pool.allocator.available() == cache.device_pool.size


def push_to_host(cache: HiRadixCache) -> None:
    cache.drain()
    cache.evict(10**9)


def push_to_storage(cache: HiRadixCache) -> None:
    cache.drain()
    cache.evict(10**9)
    cache.evict_host(10**9)
