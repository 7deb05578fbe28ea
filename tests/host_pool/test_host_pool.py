"""HostKVPool: layouts, per-layer access, canonical page bytes, memory checks."""

from __future__ import annotations

import pytest
import torch

from device_pool.shape import KVShape
from host_pool import HostKVPool, HostMemoryError, available_host_memory

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = ["layer_first", "page_first"]


def make_shape(attention: str, dtype: torch.dtype) -> KVShape:
    if attention == "mla":
        return KVShape(
            num_layers=3,
            kv_heads=1,
            head_dim=1,
            dtype=dtype,
            attention="mla",
            kv_lora_rank=8,
            rope_dim=4,
        )
    return KVShape(num_layers=3, kv_heads=2, head_dim=4, dtype=dtype)


def random_values(shape: KVShape, n: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    return tuple(
        torch.randn((n, *shape.token_shape), generator=gen).to(shape.dtype)
        for _ in range(shape.kv_per_layer)
    )


def fill(pool: HostKVPool, slots: torch.Tensor, seed: int) -> list[tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(seed)
    written = []
    for layer in range(pool.shape.num_layers):
        values = random_values(pool.shape, slots.numel(), gen)
        pool.write_layer(layer, slots, values)
        written.append(values)
    return written


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("attention", ["mha", "mla"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_write_read_round_trip(layout: str, attention: str, dtype: torch.dtype, page_size: int):
    shape = make_shape(attention, dtype)
    pool = HostKVPool(shape, 4 * page_size, page_size, layout=layout, reserve_bytes=0)
    slots = torch.randperm(pool.size)[: pool.size // 2]
    written = fill(pool, slots, seed=1)
    for layer, values in enumerate(written):
        got = pool.read_layer(layer, slots)
        assert len(got) == shape.kv_per_layer
        for g, v in zip(got, values, strict=True):
            assert g.shape == (slots.numel(), *shape.token_shape)
            assert torch.equal(g, v)


@pytest.mark.parametrize("attention", ["mha", "mla"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize(
    "src_layout,dst_layout",
    [("layer_first", "page_first"), ("page_first", "layer_first"), ("layer_first", "layer_first")],
)
def test_page_bytes_move_between_layouts(
    attention: str, dtype: torch.dtype, page_size: int, src_layout: str, dst_layout: str
):
    shape = make_shape(attention, dtype)
    src = HostKVPool(shape, 4 * page_size, page_size, layout=src_layout, reserve_bytes=0)
    dst = HostKVPool(shape, 4 * page_size, page_size, layout=dst_layout, reserve_bytes=0)
    src_slots = torch.cat([torch.arange(2 * page_size, 3 * page_size), torch.arange(0, page_size)])
    dst_slots = torch.cat(
        [torch.arange(3 * page_size, 4 * page_size), torch.arange(page_size, 2 * page_size)]
    )
    written = fill(src, src_slots, seed=2)
    views = src.page_bytes(src_slots)
    assert len(views) == 2 and all(v.readonly and v.nbytes == src.page_nbytes for v in views)
    sink = dst.page_sink(dst_slots)
    for out, view in zip(sink.views, views, strict=True):
        assert not out.readonly
        out[:] = view
    sink.commit()
    for layer, values in enumerate(written):
        for g, v in zip(dst.read_layer(layer, dst_slots), values, strict=True):
            assert torch.equal(g, v)


def test_canonical_page_order_is_layer_kv_token():
    shape = make_shape("mha", torch.float32)
    pool = HostKVPool(shape, 8, 4, layout="layer_first", reserve_bytes=0)
    slots = torch.arange(4, 8)
    written = fill(pool, slots, seed=3)
    expected = torch.stack([torch.stack(list(v)) for v in written])  # [L, kv, ps, H, D]
    (view,) = pool.page_bytes(slots)
    got = torch.frombuffer(bytearray(view), dtype=torch.float32).view(expected.shape)
    assert torch.equal(got, expected)


def test_page_first_page_bytes_is_zero_copy():
    shape = make_shape("mha", torch.float16)
    pool = HostKVPool(shape, 32, 16, layout="page_first", reserve_bytes=0)
    slots = torch.arange(16, 32)
    (view,) = pool.page_bytes(slots)
    before = bytes(view)
    pool.write_layer(0, slots, random_values(shape, 16, torch.Generator().manual_seed(4)))
    assert bytes(view) != before
    sink = pool.page_sink(slots)
    sink.views[0][:] = bytes(len(sink.views[0]))  # visible before commit: pool memory
    assert bytes(view) == bytes(len(view))
    sink.commit()
    with pytest.raises(RuntimeError):
        sink.commit()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_page_io_rejects_partial_pages(layout: str):
    pool = HostKVPool(make_shape("mha", torch.float16), 64, 16, layout=layout, reserve_bytes=0)
    for bad in (
        torch.arange(0, 8),
        torch.arange(8, 24),
        torch.arange(16, 32).flip(0),
        torch.arange(64, 80),
        torch.arange(0, 16, dtype=torch.int32),
    ):
        with pytest.raises(ValueError):
            pool.page_bytes(bad)
        with pytest.raises(ValueError):
            pool.page_sink(bad)


def test_properties_and_page_aligned_capacity():
    shape = make_shape("mha", torch.bfloat16)
    pool = HostKVPool(shape, 70, 16, layout="page_first", reserve_bytes=0)
    assert pool.size == 64 and pool.page_size == 16 and pool.layout == "page_first"
    assert pool.shape == shape
    assert pool.nbytes == 64 * shape.bytes_per_token
    assert pool.page_nbytes == 16 * shape.bytes_per_token
    assert pool.allocator.capacity == 64
    assert not pool.is_pinned


def test_allocator_returns_copies():
    pool = HostKVPool(make_shape("mha", torch.float16), 64, 16, reserve_bytes=0)
    a = pool.allocator.alloc(32)
    assert a is not None
    a.fill_(0)
    b = pool.allocator.alloc(32)
    assert b is not None and set(b.tolist()).isdisjoint({0})
    assert pool.allocator.alloc(16) is None


def test_absurd_size_raises_before_allocating():
    shape = KVShape(num_layers=64, kv_heads=8, head_dim=128)
    tokens = (10 * 2**50) // shape.bytes_per_token  # ~10 PB
    with pytest.raises(HostMemoryError, match="GiB") as info:
        HostKVPool(shape, tokens, 16)
    assert isinstance(info.value, ValueError)


def test_reserve_is_subtracted():
    shape = make_shape("mha", torch.float16)
    with pytest.raises(HostMemoryError):
        HostKVPool(shape, 16, 16, reserve_bytes=available_host_memory() + 2**30)


def test_bad_arguments():
    shape = make_shape("mha", torch.float16)
    with pytest.raises(ValueError):
        HostKVPool(shape, 64, 16, layout="token_first")
    with pytest.raises(ValueError):
        HostKVPool(shape, 8, 16)
    pool = HostKVPool(shape, 64, 16, reserve_bytes=0)
    with pytest.raises(ValueError):
        pool.read_layer(0, torch.tensor([64]))
    with pytest.raises(ValueError):
        pool.write_layer(0, torch.tensor([0]), (torch.zeros(1, 2, 4),))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_pool():
    pool = HostKVPool(make_shape("mha", torch.float16), 64, 16, pin_memory=True, reserve_bytes=0)
    assert pool.is_pinned
