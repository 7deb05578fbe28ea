"""The model: batch invariance (the basis of bit-exact caching), shapes, validation."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable

import pytest
import torch

from device_pool import DeviceKVPool, KVShape
from hicache.engine import ModelSpec, Segment, TinyLlama
from hicache.engine.invariant import exp, pad_rows, silu
from tests.hicache.engine.helpers import SPEC, chat, config, engine, reference, tokens

CAPACITY = 2048


def pool_for(spec: ModelSpec) -> DeviceKVPool:
    dtype = getattr(torch, spec.dtype)
    return DeviceKVPool(
        KVShape(spec.num_layers, spec.kv_heads, spec.head_dim, dtype), CAPACITY, 1, "cpu"
    )


def no_wait(layer: int) -> None:
    del layer


def kv_at(pool: DeviceKVPool, slots: torch.Tensor) -> list[torch.Tensor]:
    return [buf[slots] for i in range(pool.shape.num_layers) for buf in pool.layer_buffers(i)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kv_heads", [1, 4])
def test_chunked_and_batched_forward_is_bit_identical(threads: int, kv_heads: int) -> None:
    # Wide enough that element-wise ops exceed ATen's parallel grain with two threads, and
    # odd, so that a parallel split can fall inside a SIMD step.
    spec = dataclasses.replace(SPEC, kv_heads=kv_heads, hidden=256, intermediate=713)
    model, pool, rng = TinyLlama(spec), pool_for(spec), random.Random(kv_heads)
    seq = torch.tensor(tokens(rng, 150))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        full_slots = torch.arange(150)
        full = model.forward([Segment(seq, 0, full_slots)], pool, no_wait)[0]
        for trial in range(4):
            slots = 200 + torch.randperm(1600, generator=torch.Generator().manual_seed(trial))[:150]
            cuts = [0, *sorted(rng.sample(range(1, 150), trial + 1)), 150]
            for a, b in itertools.pairwise(cuts):
                other = Segment(torch.tensor(tokens(rng, 5)), 0, torch.arange(1900, 1905))
                segments = (
                    [other, Segment(seq[a:b], a, slots[:b])]
                    if trial % 2
                    else [Segment(seq[a:b], a, slots[:b])]
                )
                last = model.forward(segments, pool, no_wait)[-1]
            assert torch.equal(last, full), f"logits differ for chunks {cuts}"
            for got, want in zip(kv_at(pool, slots), kv_at(pool, full_slots), strict=True):
                assert torch.equal(got, want), f"KV differs for chunks {cuts}"
    finally:
        torch.set_num_threads(before)


def test_forward_calls_wait_layer_in_order_and_writes_kv() -> None:
    model, pool = TinyLlama(SPEC), pool_for(SPEC)
    seen: list[int] = []
    logits = model.forward(
        [Segment(torch.tensor([1, 2, 3]), 0, torch.tensor([7, 8, 9]))], pool, seen.append
    )
    assert seen == list(range(SPEC.num_layers))
    assert logits.shape == (1, SPEC.vocab) and logits.dtype == torch.float32
    written = kv_at(pool, torch.tensor([7, 8, 9]))
    assert all(bool((kv != 0).any(dim=(1, 2)).all()) for kv in written)
    assert all(bool((kv == 0).all()) for kv in kv_at(pool, torch.tensor([6, 10])))


def test_same_seed_same_model_other_seed_other_model() -> None:
    seg = [Segment(torch.tensor([5, 6]), 0, torch.tensor([0, 1]))]
    a = TinyLlama(SPEC).forward(seg, pool_for(SPEC), no_wait)
    b = TinyLlama(SPEC).forward(seg, pool_for(SPEC), no_wait)
    c = TinyLlama(dataclasses.replace(SPEC, seed=1)).forward(seg, pool_for(SPEC), no_wait)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_pool_must_match_the_model() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        SPEC.check_pool(pool_for(dataclasses.replace(SPEC, head_dim=8)))
    with pytest.raises(ValueError, match="does not fit"):
        SPEC.check_pool(pool_for(dataclasses.replace(SPEC, dtype="bfloat16")))
    with pytest.raises(ValueError, match="does not fit"):
        engine(config(16, 256, spec=dataclasses.replace(SPEC, num_layers=3)))


@pytest.mark.parametrize(
    "change", [{"num_heads": 3}, {"head_dim": 15}, {"dtype": "int8"}, {"hidden": 0}]
)
def test_spec_validation(change: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(SPEC, **change)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("op", "plain"), [(exp, torch.exp), (silu, torch.nn.functional.silu)], ids=["exp", "silu"]
)
def test_pointwise_ops_do_not_depend_on_the_tensor_shape(
    op: Callable[[torch.Tensor], torch.Tensor], plain: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    # Plain F.silu computes the last partial SIMD step of each row differently here.
    x = torch.randn(40, 713, generator=torch.Generator().manual_seed(0)) * 4
    whole = op(x)
    rows = torch.cat([op(x[i : i + 1]) for i in range(40)])
    assert torch.equal(whole, rows) and whole.shape == x.shape
    assert torch.allclose(whole, plain(x), rtol=1e-6, atol=1e-6)


def test_pad_rows() -> None:
    assert pad_rows(torch.ones(17, 2)).shape == (32, 2)
    assert torch.equal(pad_rows(torch.ones(16, 2)), torch.ones(16, 2))


def test_bfloat16_cache_matches_reference() -> None:
    # Measured bit-identical here too; the tolerance covers CPUs whose native
    # bf16 GEMM kernels may pick shape-dependent paths.
    spec = dataclasses.replace(SPEC, dtype="bfloat16")
    rng = random.Random(3)
    turns = [tokens(rng, 40), tokens(rng, 25)]
    want = chat(reference(spec=spec), turns)
    got = chat(engine(config(16, 1024, spec=spec), chunk_size=16, spec=spec), turns)
    assert got[1].hits.device == 32
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g.final_logits, w.final_logits, atol=2e-2, rtol=0)
