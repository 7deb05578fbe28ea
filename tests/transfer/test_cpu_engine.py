"""CpuTransferEngine: bit-exact round trips, per-layer loading, faults, delivery rules."""

from __future__ import annotations

import pytest
import torch

from tests.transfer.transfer_helpers import (
    device_kv,
    make_pools,
    make_shape,
    random_pages,
    randomize,
    same,
    snapshot,
)
from transfer import (
    CpuTransferEngine,
    FaultInjection,
    TransferError,
    TransferOp,
    create_transfer_engine,
)

LAYOUTS = ["layer_first", "page_first"]
TIMEOUT = 30.0


def round_trip(engine: CpuTransferEngine, dev, host, page_size: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    src = random_pages(dev.size, page_size, 3, gen)
    host_slots = random_pages(host.size, page_size, 3, gen)
    before = snapshot(dev, src)
    backup = engine.wait(engine.submit(TransferOp("d2h", src, host_slots)), TIMEOUT)
    assert backup.ok and backup.nbytes == src.numel() * dev.shape.bytes_per_token
    for layer in range(dev.shape.num_layers):  # the host copy is exactly the device KV
        for h, d in zip(host.read_layer(layer, host_slots), before[layer], strict=True):
            assert torch.equal(h, d)
    dst = random_pages(dev.size, page_size, 3, gen)
    randomize(dev, seed + 1)  # the load must overwrite whatever is there
    op_id = engine.submit(TransferOp("h2d", dst, host_slots))
    engine.start_loading()
    for layer in range(dev.shape.num_layers):
        engine.wait_layer(layer, TIMEOUT)
    load = engine.wait(op_id, TIMEOUT)
    assert load.ok and load.kind == "h2d" and load.nbytes == backup.nbytes
    assert same(snapshot(dev, dst), before)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("attention", ["mha", "mla"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_round_trip_is_bit_exact(layout: str, attention: str, page_size: int):
    dev, host = make_pools(make_shape(attention, torch.bfloat16), page_size, layout)
    randomize(dev, seed=1)
    with CpuTransferEngine(dev, host, num_workers=2) as engine:
        round_trip(engine, dev, host, page_size, seed=2)
        assert engine.pending() == 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_token_granular_and_mixed_page_sizes(layout: str):
    shape = make_shape()
    dev, _ = make_pools(shape, 4, layout, pages=16)
    _, host = make_pools(shape, 16, layout, pages=4)
    randomize(dev, seed=3)
    gen = torch.Generator().manual_seed(4)
    cases = [
        (
            torch.randperm(dev.size, generator=gen)[:10],
            torch.randperm(host.size, generator=gen)[:10],
        ),
        (random_pages(dev.size, 4, 8, gen), random_pages(host.size, 16, 2, gen)),  # 4-token blocks
    ]
    with CpuTransferEngine(dev, host) as engine:
        for src, host_slots in cases:
            assert engine.wait(engine.submit(TransferOp("d2h", src, host_slots)), TIMEOUT).ok
            for layer in range(shape.num_layers):
                got = host.read_layer(layer, host_slots)
                assert all(
                    torch.equal(g, d) for g, d in zip(got, device_kv(dev, layer, src), strict=True)
                )


def test_wait_layer_returns_only_once_that_layer_is_loaded():
    shape = make_shape(layers=4)
    dev, host = make_pools(shape, 16, "page_first")
    randomize(dev, seed=5)
    gen = torch.Generator().manual_seed(6)
    src, host_slots = random_pages(dev.size, 16, 2, gen), random_pages(host.size, 16, 2, gen)
    dst = random_pages(dev.size, 16, 2, gen)
    expected = snapshot(dev, src)
    faults = FaultInjection(delay_s=0.01, jitter_s=0.01, seed=1)
    with CpuTransferEngine(dev, host, num_workers=2, faults=faults) as engine:
        engine.wait(engine.submit(TransferOp("d2h", src, host_slots)), TIMEOUT)
        for buf in (b for layer in range(4) for b in dev.layer_buffers(layer)):
            buf[dst] = 0
        ids = [engine.submit(TransferOp("h2d", dst, host_slots))]
        engine.start_loading()
        for layer in range(shape.num_layers):
            engine.wait_layer(layer, TIMEOUT)
            got = device_kv(dev, layer, dst)
            assert all(torch.equal(g, e) for g, e in zip(got, expected[layer], strict=True))
        assert all(engine.wait(i, TIMEOUT).ok for i in ids)


def test_wait_layer_without_batch_and_bad_layer():
    dev, host = make_pools(make_shape(), 16, "layer_first")
    with CpuTransferEngine(dev, host) as engine:
        engine.wait_layer(0)  # nothing started: returns at once
        engine.start_loading()  # nothing queued: clears the counter
        engine.wait_layer(2)
        engine.submit(TransferOp("h2d", torch.arange(16), torch.arange(16)))
        engine.start_loading()
        with pytest.raises(IndexError):
            engine.wait_layer(3)
        engine.wait_layer(2, TIMEOUT)


def test_failures_become_completions_and_engine_keeps_working():
    dev, host = make_pools(make_shape(), 16, "layer_first")
    randomize(dev, seed=7)
    faults = FaultInjection(fail_every=2)
    with CpuTransferEngine(dev, host, faults=faults) as engine:
        slots = torch.arange(32)
        results = [
            engine.wait(engine.submit(TransferOp("d2h", slots, slots)), TIMEOUT) for _ in range(4)
        ]
        assert [c.ok for c in results] == [True, False, True, False]
        failed = results[1]
        assert "InjectedFault" in (failed.error or "") and failed.nbytes == 0
        # A failed load makes wait_layer raise; the next batch loads fine.
        bad = engine.submit(TransferOp("h2d", slots, slots))  # op 5: ok
        worse = engine.submit(TransferOp("h2d", slots, slots))  # op 6: fails
        engine.start_loading()
        with pytest.raises(TransferError, match="layer 0"):
            engine.wait_layer(0, TIMEOUT)
        assert engine.wait(bad, TIMEOUT).ok and not engine.wait(worse, TIMEOUT).ok
        good = engine.submit(TransferOp("h2d", slots, slots))  # op 7: ok
        engine.start_loading()
        for layer in range(3):
            engine.wait_layer(layer, TIMEOUT)
        assert engine.wait(good, TIMEOUT).ok


def test_held_completions_are_released_once_each_in_shuffled_order():
    dev, host = make_pools(make_shape(), 1, "page_first", pages=64)
    randomize(dev, seed=8)
    faults = FaultInjection(hold=True, reorder=True, jitter_s=0.002, seed=3)
    with CpuTransferEngine(dev, host, num_workers=2, faults=faults) as engine:
        src = torch.arange(40, 44)
        ids = [
            engine.submit(TransferOp("d2h", torch.tensor([i]), torch.tensor([i])))
            for i in range(12)
        ]
        for layer in range(3):  # what the loads bring back: random, unlike the pool's zeros
            host.write_layer(layer, torch.arange(20, 24), tuple(device_kv(dev, layer, src)))
        ids += [
            engine.submit(TransferOp("h2d", torch.tensor([i + 32]), torch.tensor([i + 20])))
            for i in range(4)
        ]
        engine.start_loading()
        for layer in range(3):
            engine.wait_layer(layer, TIMEOUT)
        assert engine.poll() == []  # every copy may be done, but nothing is delivered
        delivered = []
        for n in (5, 0, 7):
            assert engine.release(n, TIMEOUT) == n
            delivered += engine.poll()
        assert engine.release(10, timeout=0.01) <= 4  # only 16 ops exist
        delivered += engine.poll()
        delivered += [engine.wait(i, TIMEOUT) for i in ids if i not in {c.op_id for c in delivered}]
        got = [c.op_id for c in delivered]
        assert sorted(got) == ids and got != ids
        assert all(c.ok for c in delivered)
        assert engine.pending() == 0 and engine.poll() == []
        assert same(snapshot(dev, torch.arange(32, 36)), snapshot(dev, src))


def test_release_without_hold_is_an_error():
    dev, host = make_pools(make_shape(), 16, "layer_first")
    with CpuTransferEngine(dev, host) as engine, pytest.raises(TransferError):
        engine.release()


def test_wait_rules():
    dev, host = make_pools(make_shape(), 16, "layer_first")
    with CpuTransferEngine(dev, host, faults=FaultInjection(hold=True)) as engine:
        slots = torch.arange(16)
        first = engine.submit(TransferOp("d2h", slots, slots))
        second = engine.submit(TransferOp("d2h", slots, slots))
        assert engine.wait(second, TIMEOUT).op_id == second  # held ops are still waitable
        assert engine.release(1, TIMEOUT) == 1
        assert [c.op_id for c in engine.poll()] == [first]
        assert engine.release() == 0
        for op_id in (first, second, 99):
            with pytest.raises(TransferError, match="unknown or"):
                engine.wait(op_id)
        queued = engine.submit(TransferOp("h2d", slots, slots))
        with pytest.raises(TransferError, match="start_loading"):
            engine.wait(queued)
        assert engine.pending() == 1
        engine.start_loading()
        assert engine.wait(queued, TIMEOUT).ok
        assert engine.pending() == 0


def test_wait_times_out():
    dev, host = make_pools(make_shape(), 16, "layer_first")
    with CpuTransferEngine(dev, host, faults=FaultInjection(delay_s=5.0)) as engine:
        op_id = engine.submit(TransferOp("d2h", torch.arange(16), torch.arange(16)))
        with pytest.raises(TransferError, match="timed out"):
            engine.wait(op_id, timeout=0.01)
    # close() cut the delay short and the op still completed exactly once
    assert engine.wait(op_id, TIMEOUT).ok


def test_close_semantics():
    dev, host = make_pools(make_shape(), 16, "layer_first")
    engine = CpuTransferEngine(dev, host, num_workers=2)
    slots = torch.arange(16)
    backup = engine.submit(TransferOp("d2h", slots, slots))
    queued = engine.submit(TransferOp("h2d", slots, slots))
    engine.close()
    engine.close()
    done = {c.op_id: c for c in engine.poll()}
    assert done[backup].ok
    assert not done[queued].ok and "closed" in (done[queued].error or "")
    assert engine.pending() == 0
    with pytest.raises(TransferError, match="closed"):
        engine.submit(TransferOp("d2h", slots, slots))
    with pytest.raises(TransferError, match="closed"):
        engine.start_loading()


def test_op_and_pool_validation():
    with pytest.raises(ValueError):
        TransferOp("x2y", torch.arange(4), torch.arange(4))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TransferOp("d2h", torch.arange(4), torch.arange(5))
    with pytest.raises(ValueError):
        TransferOp("d2h", torch.arange(4, dtype=torch.int32), torch.arange(4))
    dev, host = make_pools(make_shape(), 16, "layer_first")
    _, other = make_pools(make_shape(layers=2), 16, "layer_first")
    with pytest.raises(ValueError, match="different KV"):
        CpuTransferEngine(dev, other)
    with CpuTransferEngine(dev, host) as engine:
        with pytest.raises(ValueError, match="out of range"):
            engine.submit(TransferOp("d2h", torch.tensor([dev.size]), torch.tensor([0])))
        with pytest.raises(ValueError, match="out of range"):
            engine.submit(TransferOp("h2d", torch.tensor([0]), torch.tensor([-1])))
        assert engine.pending() == 0


def test_create_transfer_engine():
    dev, host = make_pools(make_shape(), 16, "layer_first")
    engine = create_transfer_engine(dev, host)
    assert isinstance(engine, CpuTransferEngine)
    engine.close()
    with pytest.raises(ValueError, match="backend"):
        create_transfer_engine(dev, host, backend="rdma")
    with pytest.raises(ValueError, match="CUDA"):
        create_transfer_engine(dev, host, backend="cuda")
