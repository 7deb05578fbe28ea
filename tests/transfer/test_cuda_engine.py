"""CudaTransferEngine on a real GPU (skipped without CUDA)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from device_pool.kv_pool import DeviceKVPool
from host_pool.kv_pool import HostKVPool
from host_pool.memory import pinned_size
from tests.transfer.transfer_helpers import (
    IO_BACKENDS,
    make_pools,
    make_shape,
    random_pages,
    randomize,
    same,
    snapshot,
)
from transfer import TransferError, TransferOp, create_transfer_engine

TIMEOUT = 60.0
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
BACKENDS = IO_BACKENDS


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


# ---- ordering, overlap and failure tests (issue 15) -------------------------
# A stall is a GPU spin queued on a copy stream before the engine's own work:
# about a second on current GPUs, far longer than any copy here. The tests
# assert the order of events against it, never a duration.
STALL_CYCLES = 2_000_000_000


def stall(stream: torch.cuda.Stream) -> None:
    with torch.cuda.stream(stream):
        torch.cuda._sleep(STALL_CYCLES)


def disjoint_pages(capacity: int, page_size: int, groups: int, count: int) -> list[torch.Tensor]:
    pages = torch.randperm(capacity // page_size, generator=torch.Generator().manual_seed(7))
    out = []
    for g in range(groups):
        chosen = pages[g * count : (g + 1) * count]
        out.append((chosen[:, None] * page_size + torch.arange(page_size)).reshape(-1))
    return out


def read_after_wait_layers(engine, dev, slots: torch.Tensor) -> list[list[torch.Tensor]]:
    """Per layer: wait_layer(i) only, then copy the KV at ``slots`` on the compute stream."""
    on_dev = slots.to(dev.layer_buffers(0)[0].device)
    got = []
    for layer in range(dev.shape.num_layers):
        engine.wait_layer(layer, TIMEOUT)
        got.append([buf[on_dev].clone() for buf in dev.layer_buffers(layer)])
    torch.cuda.current_stream().synchronize()
    return [[t.cpu() for t in layer] for layer in got]


DEVICES = [
    "cuda",
    pytest.param(
        "cuda:1",
        marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs"),
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("io_backend", BACKENDS)
@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_reads_after_wait_layer_see_the_loaded_kv(io_backend: str, layout: str, device: str):
    """Without a GPU-side wait in wait_layer the reads run during the stall and see zeros.
    On cuda:1 (current device 0), mapping, tables and copies must use the pool's device."""
    dev, host = make_pools(make_shape("mha", torch.float16), 16, layout, device=device)
    randomize(dev, seed=3)
    src, dst, host_slots = disjoint_pages(dev.size, 16, 3, 2)
    want = snapshot(dev, src)
    with create_transfer_engine(dev, host, io_backend=io_backend) as engine:  # type: ignore[arg-type]
        assert engine.wait(engine.submit(TransferOp("d2h", src, host_slots)), TIMEOUT).ok
        op_id = engine.submit(TransferOp("h2d", dst, host_slots))
        stall(engine.load_stream)  # type: ignore[attr-defined]
        engine.start_loading()
        with torch.cuda.device(dev.device):  # the compute stream of the pool's device
            got = read_after_wait_layers(engine, dev, dst)
        assert engine.wait(op_id, TIMEOUT).ok
    assert same(got, want)


@pytest.mark.parametrize("io_backend", BACKENDS)
def test_a_load_does_not_queue_behind_a_backup(io_backend: str):
    """A backup and a load run together; the load lands while the backup is stalled."""
    dev, host = make_pools(make_shape("mla", torch.bfloat16), 16, "page_first", device="cuda")
    randomize(dev, seed=4)
    src_a, host_a, src_b, host_b, dst_b = disjoint_pages(dev.size, 16, 5, 1)
    with create_transfer_engine(dev, host, io_backend=io_backend) as engine:  # type: ignore[arg-type]
        assert engine.wait(engine.submit(TransferOp("d2h", src_b, host_b)), TIMEOUT).ok
        want_a, want_b = snapshot(dev, src_a), snapshot(dev, src_b)
        stall(engine.backup_stream)  # type: ignore[attr-defined]
        backup = engine.submit(TransferOp("d2h", src_a, host_a))
        load = engine.submit(TransferOp("h2d", dst_b, host_b))
        engine.start_loading()
        got = read_after_wait_layers(engine, dev, dst_b)
        assert not engine.backup_stream.query()  # type: ignore[attr-defined]
        assert engine.wait(load, TIMEOUT).ok
        assert same(got, want_b)
        assert engine.wait(backup, TIMEOUT).ok
    for layer in range(dev.shape.num_layers):
        assert same([host.read_layer(layer, host_a)], [want_a[layer]])


def fail_on_call(n: int, real):
    calls = {"count": 0}

    def wrapper(*args, **kwargs):
        calls["count"] += 1
        if calls["count"] == n:
            raise RuntimeError("injected copy failure")
        return real(*args, **kwargs)

    return wrapper


def test_a_failed_backup_is_posted_after_its_queued_copies(monkeypatch: pytest.MonkeyPatch):
    import transfer.cuda as cuda_module

    dev, host = make_pools(make_shape("mha", torch.float16), 16, "layer_first", device="cuda")
    slots = torch.arange(4 * 16)
    # Call 1 gathers layer 0, whose copy is then queued; call 2 (layer 1) fails.
    real = cuda_module.gather_from_device
    monkeypatch.setattr(cuda_module, "gather_from_device", fail_on_call(2, real))
    with create_transfer_engine(dev, host) as engine:
        stall(engine.backup_stream)  # type: ignore[attr-defined]
        done = engine.wait(engine.submit(TransferOp("d2h", slots, slots)), TIMEOUT)
        assert not done.ok and "injected" in (done.error or "")
        assert engine.backup_stream.query()  # type: ignore[attr-defined]


@pytest.mark.parametrize("io_backend", BACKENDS)
def test_a_failed_load_is_posted_after_its_queued_copies(
    io_backend: str, monkeypatch: pytest.MonkeyPatch
):
    import transfer.cuda as cuda_module
    import transfer.kernels as kernels_module

    dev, host = make_pools(make_shape("mha", torch.float16), 16, "page_first", device="cuda")
    slots = torch.arange(4 * 16)
    if io_backend == "kernel":
        real = kernels_module.BlockCopyKernel.launch
        monkeypatch.setattr(kernels_module.BlockCopyKernel, "launch", fail_on_call(2, real))
    else:  # call 1 stages layer 0; call 2 (layer 1) fails
        real = cuda_module.gather_from_host
        monkeypatch.setattr(cuda_module, "gather_from_host", fail_on_call(2, real))
    with create_transfer_engine(dev, host, io_backend=io_backend) as engine:  # type: ignore[arg-type]
        op_id = engine.submit(TransferOp("h2d", slots, slots))
        stall(engine.load_stream)  # type: ignore[attr-defined]
        engine.start_loading()
        engine.wait_layer(0, TIMEOUT)
        with pytest.raises(TransferError, match="injected"):
            engine.wait_layer(1, TIMEOUT)
        done = engine.wait(op_id, TIMEOUT)
        assert not done.ok
        assert engine.load_stream.query()  # type: ignore[attr-defined]


def test_host_pool_pins_exactly_its_own_bytes():
    """Registered, not allocated through torch's power-of-two caching host allocator."""
    key = "allocated_bytes.current"
    before = torch.cuda.host_memory_stats().get(key, 0)
    shape = make_shape("mha", torch.float16)
    pool = HostKVPool(shape, 16 * 333, 16, pin_memory=True, reserve_bytes=0)
    assert pool.nbytes & (pool.nbytes - 1)  # not a power of two: rounding would show
    assert torch.cuda.host_memory_stats().get(key, 0) == before
    assert pool.pinned_nbytes == pinned_size(pool.nbytes)
    assert pool.data.is_pinned() and pool.is_pinned
    pool.close()
    assert pool.pinned_nbytes == 0 and not pool.data.is_pinned()
    pool.close()  # idempotent


def test_engine_staging_is_registered_once():
    """Backups of growing size allocate nothing from torch's pinned allocator but
    index tensors (per-op pinned staging would add 64, 128 and 256 KiB blocks)."""
    dev, host = make_pools(make_shape("mha", torch.float16), 16, "page_first", 64, "cuda")
    randomize(dev, seed=5)
    key = "allocated_bytes.current"
    with create_transfer_engine(dev, host) as engine:
        small = torch.arange(16)
        assert engine.wait(engine.submit(TransferOp("d2h", small, small)), TIMEOUT).ok
        before = torch.cuda.host_memory_stats().get(key, 0)
        for pages in (16, 32, 64):
            slots = torch.arange(pages * 16)
            assert engine.wait(engine.submit(TransferOp("d2h", slots, slots)), TIMEOUT).ok
            assert same(snapshot(dev, slots), [list(host.read_layer(i, slots)) for i in range(3)])
        assert torch.cuda.host_memory_stats().get(key, 0) - before < 16 << 10


def test_auto_and_bare_cuda_resolve_to_an_indexed_device():
    shape = make_shape("mha", torch.float16)
    for name in ("auto", "cuda"):
        pool = DeviceKVPool(shape, 64, 16, device=name)
        assert pool.device == torch.device("cuda", torch.cuda.current_device())


@pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="needs cupy")
def test_kernel_launched_by_both_lanes_at_once():
    """Backups (backup lane) and a load batch (load lane) launch the one kernel together."""
    dev, host = make_pools(make_shape("mha", torch.float16), 16, "page_first", 64, "cuda")
    randomize(dev, seed=8)
    groups = disjoint_pages(dev.size, 16, 10, 4)
    loaded, dst = groups[0], groups[1]
    with create_transfer_engine(dev, host, io_backend="kernel") as engine:
        assert engine.wait(engine.submit(TransferOp("d2h", loaded, loaded)), TIMEOUT).ok
        want_load = snapshot(dev, loaded)
        want = {i: snapshot(dev, g) for i, g in enumerate(groups[2:])}
        load = engine.submit(TransferOp("h2d", dst, loaded))
        engine.start_loading()
        backups = [engine.submit(TransferOp("d2h", g, g)) for g in groups[2:]]
        got = read_after_wait_layers(engine, dev, dst)
        assert engine.wait(load, TIMEOUT).ok
        assert all(engine.wait(b, TIMEOUT).ok for b in backups)
    assert same(got, want_load)
    for i, g in enumerate(groups[2:]):
        assert same([list(host.read_layer(layer, g)) for layer in range(3)], want[i])
