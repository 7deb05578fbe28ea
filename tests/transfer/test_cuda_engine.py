"""CudaTransferEngine on a real GPU (skipped without CUDA)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.transfer.transfer_helpers import (
    make_pools,
    make_shape,
    random_pages,
    randomize,
    same,
    snapshot,
)
from transfer import TransferOp, create_transfer_engine

TIMEOUT = 60.0
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
BACKENDS = [
    "direct",
    pytest.param(
        "kernel",
        marks=pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="needs cupy"),
    ),
]


@pytest.mark.parametrize("io_backend", BACKENDS)
@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
@pytest.mark.parametrize("attention", ["mha", "mla"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_cuda_round_trip(io_backend: str, layout: str, attention: str, page_size: int):
    dev, host = make_pools(make_shape(attention, torch.bfloat16), page_size, layout, device="cuda")
    randomize(dev, seed=1)
    gen = torch.Generator().manual_seed(2)
    src, dst = random_pages(dev.size, page_size, 3, gen), random_pages(dev.size, page_size, 3, gen)
    host_slots = random_pages(host.size, page_size, 3, gen)
    before = snapshot(dev, src)
    with create_transfer_engine(dev, host, io_backend=io_backend) as engine:  # type: ignore[arg-type]
        assert engine.wait(engine.submit(TransferOp("d2h", src, host_slots)), TIMEOUT).ok
        for layer in range(dev.shape.num_layers):
            got = host.read_layer(layer, host_slots)
            assert all(torch.equal(g, b) for g, b in zip(got, before[layer], strict=True))
        op_id = engine.submit(TransferOp("h2d", dst, host_slots))
        engine.start_loading()
        for layer in range(dev.shape.num_layers):
            engine.wait_layer(layer, TIMEOUT)
        torch.cuda.current_stream().synchronize()
        assert engine.wait(op_id, TIMEOUT).ok
        assert same(snapshot(dev, dst), before)


def test_backup_sees_kv_written_just_before_submit():
    """The copy stream waits for compute-stream writes enqueued before submit."""
    dev, host = make_pools(make_shape(layers=2), 16, "page_first", pages=64, device="cuda")
    slots = torch.arange(64 * 16)
    with create_transfer_engine(dev, host) as engine:
        for value in (1.0, 2.0, 3.0):
            for layer in range(2):
                for buf in dev.layer_buffers(layer):
                    torch.cuda._sleep(1_000_000)  # keep the compute stream busy
                    buf.fill_(value)
            done = engine.wait(engine.submit(TransferOp("d2h", slots, slots)), TIMEOUT)
            assert done.ok
            assert bool((host.read_layer(1, slots)[1] == value).all())
