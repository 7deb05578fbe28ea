"""The MLA (latent attention) model: cached runs equal a full recompute, bit for bit.

MLA pools keep one latent vector per token and layer (the compressed
``c_kv`` plus the decoupled rotary key). The chat tests of
tests/hicache/engine/test_correctness.py run
this model through device hits, host load-backs (both host layouts) and
storage prefetches with a restart; here: its pool geometry, validation,
chunking and a shared prompt across the tiers.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from device_pool import DeviceKVPool, KVShape
from hicache.engine import ModelSpec, Request, Segment, TinyLlama
from tests.hicache.engine.helpers import (
    MLA,
    SPEC,
    assert_same,
    config,
    engine,
    generate,
    push_to_host,
    push_to_storage,
    reference,
    tokens,
)


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
