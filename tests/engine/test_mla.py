"""The MLA (latent attention) model: cached runs equal a full recompute, bit for bit.

MLA pools keep one latent vector per token and layer (the compressed
``c_kv`` plus the decoupled rotary key). These tests prove that such pools
survive every tier on the way back to attention: device hits, host
load-backs (both host layouts) and storage prefetches, against the no-cache
reference of the same model.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from device_pool import DeviceKVPool, KVShape
from hicache.engine import ModelSpec, Request, Segment, TinyLlama
from tests.engine.helpers import (
    SPEC,
    assert_clean,
    assert_same,
    chat,
    config,
    engine,
    generate,
    push_to_host,
    push_to_storage,
    reference,
    tokens,
)

MLA = dataclasses.replace(
    SPEC, attention="mla", kv_heads=1, head_dim=16, kv_lora_rank=24, rope_dim=8
)
PAGE_SIZES = [1, 16]


def user_turns(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [tokens(rng, n) for n in (40, 21, 33)]


def test_mla_pool_keeps_one_latent_per_token_and_layer() -> None:
    cfg = config(16, 256, spec=MLA)
    shape = cfg.model.kv_shape()
    assert shape.attention == "mla" and shape.kv_per_layer == 1
    assert shape.token_shape == (1, MLA.kv_lora_rank + MLA.rope_dim)
    eng = engine(cfg, spec=MLA)
    assert eng.cache.device_pool.layer_buffers(0)[0].shape == (256, 1, 32)


def test_mla_and_mha_pools_do_not_mix() -> None:
    mha_pool = DeviceKVPool(KVShape(2, 2, 16, torch.float32), 64, 1, "cpu")
    with pytest.raises(ValueError, match="does not fit"):
        MLA.check_pool(mha_pool)
    with pytest.raises(ValueError, match="does not fit"):
        engine(config(16, 256, spec=MLA), spec=SPEC)


@pytest.mark.parametrize("change", [{"kv_lora_rank": 0}, {"rope_dim": 0}, {"rope_dim": 3}])
def test_mla_spec_validation(change: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(MLA, **change)


def test_mla_chunked_forward_is_bit_identical() -> None:
    model = TinyLlama(MLA)
    pool = DeviceKVPool(config(1, 512, spec=MLA).model.kv_shape(), 512, 1, "cpu")
    seq = torch.tensor(tokens(random.Random(0), 90))
    full = model.forward([Segment(seq, 0, torch.arange(90))], pool, lambda i: None)[0]
    slots = 100 + torch.randperm(400, generator=torch.Generator().manual_seed(1))[:90]
    for a, b in [(0, 17), (17, 50), (50, 90)]:
        last = model.forward([Segment(seq[a:b], a, slots[:b])], pool, lambda i: None)[0]
    assert torch.equal(last, full)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_mla_device_hits(page_size: int) -> None:
    turns = user_turns(1)
    want = chat(reference(chunk_size=1000, spec=MLA), turns)
    eng = engine(config(page_size, 1024, spec=MLA), chunk_size=24, spec=MLA)
    got = chat(eng, turns)
    assert_same(got, want)
    assert all(out.hits.device > 0 for out in got[1:])
    assert_clean(eng.cache)


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_mla_host_load_back(page_size: int, layout: str) -> None:
    turns = user_turns(2)
    want = chat(reference(spec=MLA), turns)
    eng = engine(config(page_size, 1024, host=True, spec=MLA, layout=layout), spec=MLA)
    got = chat(eng, turns, between=push_to_host)
    assert_same(got, want)
    assert all(out.hits.host > 0 and out.hits.device == 0 for out in got[1:])
    assert_clean(eng.cache)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_mla_storage_prefetch_and_restart(tmp_path: Path, page_size: int) -> None:
    turns = user_turns(3)
    want = chat(reference(spec=MLA), turns)
    eng = engine(config(page_size, 1024, store=tmp_path / "store", spec=MLA), spec=MLA)
    got = chat(eng, turns, between=push_to_storage)
    assert_same(got, want)
    assert all(out.hits.storage > 0 and out.hits.device == 0 for out in got[1:])
    assert_clean(eng.cache)
    eng.cache.close()
    again = engine(config(page_size, 1024, store=tmp_path / "store", spec=MLA), spec=MLA)
    assert_same(chat(again, turns), want)
    again.cache.close()


def test_mla_shared_prompt_across_tiers(tmp_path: Path) -> None:
    rng = random.Random(6)
    system = tokens(rng, 72)
    requests = [Request(f"r{i}", tuple(system + tokens(rng, 9)), 3) for i in range(3)]
    want = generate(reference(spec=MLA), requests)
    eng = engine(config(16, 2048, store=tmp_path / "store", spec=MLA), spec=MLA)
    got = generate(eng, requests[:1])
    push_to_host(eng.cache)
    got += generate(eng, requests[1:2])
    push_to_storage(eng.cache)
    got += generate(eng, requests[2:])
    assert_same(got, want)
    assert got[1].hits.host >= 64 and got[2].hits.storage >= 64
    eng.cache.close()


def test_mla_spec_for_cache() -> None:
    model = config(16, 256, spec=MLA).model
    spec = ModelSpec.for_cache(model, 64, 256, torch.device("cpu"))
    assert spec.attention == "mla" and spec.kv_lora_rank == 24 and spec.rope_dim == 8
    assert spec.num_heads == 4
