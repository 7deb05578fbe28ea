"""The reference engine on CUDA (skipped without it).

GPU matmuls are not row-invariant (cuBLAS picks kernels by shape), so a cached
run is compared with the no-cache reference by greedy tokens (equal) and final
logits within ``LOGIT_ATOL``: float32 compute puts real differences near 1e-6,
so 1e-3 is loose enough for kernel choice and tight enough to catch a wrong
page (which moves logits by O(1)).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from device_pool import DeviceKVPool
from hicache.config.cache import TransferConfig
from hicache.engine import Request, RequestOutput, Segment, TinyLlama
from host_pool import HostKVPool
from tests.hicache.engine.helpers import (
    MLA,
    SPEC,
    assert_clean,
    chat,
    config,
    engine,
    push_to_host,
    push_to_storage,
    reference,
    tokens,
)
from tests.transfer.transfer_helpers import IO_BACKENDS
from transfer import TransferOp, create_transfer_engine

LOGIT_ATOL = 1e-3
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def assert_close(got: list[RequestOutput], want: list[RequestOutput]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.output_tokens == w.output_tokens, f"{g.request_id}: tokens differ"
        diff = float((g.final_logits - w.final_logits).abs().max())
        assert diff <= LOGIT_ATOL, f"{g.request_id}: logits differ by {diff}"


def cycle_tiers(turn: list[int]):
    """Between turns: keep on device, then push to host, then to storage, repeat."""

    def between(cache) -> None:
        step = turn[0] % 3
        turn[0] += 1
        if step == 1:
            push_to_host(cache)
        elif step == 2:
            push_to_storage(cache)

    return between


@pytest.mark.parametrize("io_backend", IO_BACKENDS)
@pytest.mark.parametrize("spec", [SPEC, MLA], ids=["mha", "mla"])
@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_cached_engine_matches_the_reference_on_cuda(
    tmp_path: Path, io_backend: str, spec, layout: str
) -> None:
    rng = random.Random(11)
    turns = [tokens(rng, n) for n in (40, 21, 33, 18, 27)]
    want = chat(reference(spec=spec, device="cuda"), turns)
    cfg = config(16, 1024, store=tmp_path / "s", spec=spec, device="cuda", layout=layout)
    cfg = dataclasses.replace(cfg, transfer=TransferConfig(backend="cuda", io_backend=io_backend))
    eng = engine(cfg, spec=spec)
    got = chat(eng, turns, between=cycle_tiers([0]))
    assert_close(got, want)
    assert got[2].hits.host > 0 and got[3].hits.storage > 0
    assert_clean(eng.cache)
    eng.cache.close()


def test_forward_does_not_sync_with_the_gpu_per_layer() -> None:
    """Slots cross to the device once per pass: no layer syncs (which would cancel
    the overlap of per-layer loads with compute). A load batch is in flight."""
    shape = config(16, 512).model.kv_shape()
    pool = DeviceKVPool(shape, 512, 16, "cuda")
    host = HostKVPool(shape, 512, 16, pin_memory=True, reserve_bytes=0)
    model = TinyLlama(SPEC, pool.device)
    segments = [Segment(torch.tensor(tokens(random.Random(1), 32)), 0, torch.arange(32))]
    with create_transfer_engine(pool, host) as transfer:
        transfer.submit(TransferOp("h2d", torch.arange(64, 128), torch.arange(64)))
        transfer.start_loading()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            logits = model.forward(segments, pool, transfer.wait_layer)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert logits.device.type == "cuda" and logits.shape == (1, SPEC.vocab)


def test_generate_on_cuda_returns_every_token() -> None:
    eng = engine(config(16, 512, device="cuda"))
    out = eng.generate([Request("r", tuple(range(40)), 3)])[0]
    assert len(out.output_tokens) == 3
    assert out.final_logits.shape == (SPEC.vocab,)
    eng.cache.close()
