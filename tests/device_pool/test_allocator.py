from __future__ import annotations

import numpy as np
import pytest
import torch

from device_pool import DeviceKVPool, KVShape, PagedAllocator, ReqToTokenPool, SlotError
from device_pool.kv_pool import resolve_device, tokens_for_bytes


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_alloc_is_page_aligned_and_a_copy(page_size: int) -> None:
    alloc = PagedAllocator(8 * page_size, page_size)
    slots = alloc.alloc(3 * page_size)
    assert slots is not None and slots.dtype == torch.int64
    assert slots.numel() == 3 * page_size
    pages = slots.view(-1, page_size)
    assert torch.equal(pages - pages[:, :1], torch.arange(page_size).expand_as(pages))
    assert bool((pages[:, 0] % page_size == 0).all())
    slots.fill_(0)  # mutating the result must not corrupt the allocator
    assert alloc.available() == 5 * page_size
    again = alloc.alloc(5 * page_size)
    assert again is not None and alloc.available() == 0
    assert alloc.alloc(page_size) is None


def test_free_validates_and_changes_nothing_on_error() -> None:
    alloc = PagedAllocator(64, 16)
    slots = alloc.alloc(32)
    assert slots is not None
    with pytest.raises(SlotError):
        alloc.free(slots[:8])  # half a page
    with pytest.raises(SlotError):
        alloc.free(torch.tensor(list(range(48, 64)), dtype=torch.int64))  # never handed out
    with pytest.raises(SlotError):
        alloc.free(torch.cat([slots[:16], slots[:16]]))  # twice in one call
    with pytest.raises(SlotError):
        alloc.free(slots.to(torch.int32))
    assert alloc.available() == 32
    alloc.free(slots)
    assert alloc.available() == 64
    with pytest.raises(SlotError):
        alloc.free(slots)  # double free


def test_alloc_rejects_partial_pages() -> None:
    alloc = PagedAllocator(64, 16)
    with pytest.raises(ValueError):
        alloc.alloc(10)
    with pytest.raises(ValueError):
        PagedAllocator(60, 16)


@pytest.mark.parametrize("attention", ["mha", "mla"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_device_pool_layouts(attention: str, dtype: torch.dtype) -> None:
    shape = KVShape(3, 2, 8, dtype, attention, kv_lora_rank=12, rope_dim=4)  # type: ignore[arg-type]
    pool = DeviceKVPool(shape, 64, 16, "auto")
    assert pool.device.type in ("cpu", "cuda")
    bufs = pool.layer_buffers(1)
    assert len(bufs) == shape.kv_per_layer
    assert all(b.shape == (64, *shape.token_shape) and b.dtype == dtype for b in bufs)
    slots = pool.allocator.alloc(16)
    assert slots is not None
    values = [torch.randn(16, *shape.token_shape) for _ in bufs]
    pool.set_kv(1, slots, *values)
    for buf, val in zip(pool.layer_buffers(1), values, strict=True):
        assert torch.equal(buf[slots], val.to(dtype))
    assert pool.nbytes == 64 * shape.bytes_per_token
    if attention == "mha":
        assert pool.k_buffer(0) is pool.layer_buffers(0)[0]
        with pytest.raises(ValueError):
            pool.kv_buffer(0)
    else:
        assert pool.kv_buffer(0).shape == (64, 1, 16)
        with pytest.raises(ValueError):
            pool.k_buffer(0)


def test_pool_size_in_bytes_and_device_resolution() -> None:
    shape = KVShape(2, 2, 4, torch.float32)
    assert tokens_for_bytes(shape, 10 * 16 * shape.bytes_per_token + 5, 16) == 160
    with pytest.raises(ValueError):
        tokens_for_bytes(shape, 10, 16)
    assert resolve_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError):
            resolve_device("cuda")


def test_shape_validation() -> None:
    with pytest.raises(ValueError):
        KVShape(0, 2, 4)
    with pytest.raises(ValueError):
        KVShape(2, 2, 4, torch.int32)
    with pytest.raises(ValueError):
        KVShape(2, 2, 4, attention="gqa")  # type: ignore[arg-type]
    assert KVShape(2, 2, 4, torch.float16).bytes_per_token == 2 * 2 * 2 * 4 * 2


def test_req_to_token_pool() -> None:
    pool = ReqToTokenPool(2, 8)
    a, b = pool.alloc(), pool.alloc()
    assert a is not None and b is not None and pool.alloc() is None
    pool.write(a, 2, torch.tensor([5, 6], dtype=torch.int64))
    assert pool.read(a, 4, 2).tolist() == [5, 6]
    with pytest.raises(ValueError):
        pool.write(a, 7, torch.tensor([1, 2], dtype=torch.int64))
    pool.free(a)
    with pytest.raises(ValueError):
        pool.free(a)


@pytest.mark.parametrize("page_size", [1, 4])
def test_ownership_transitions_are_checked(page_size: int) -> None:
    alloc = PagedAllocator(8 * page_size, page_size)
    req = alloc.alloc(4 * page_size)
    assert req is not None
    ps = page_size
    assert alloc.counts() == (4 * ps, 4 * ps, 0) and alloc.request_held() == 4 * ps
    alloc.to_tree(req[: 2 * ps])
    assert alloc.counts() == (4 * ps, 2 * ps, 2 * ps)
    with pytest.raises(SlotError, match="tree-owned"):
        alloc.free_request(req[:ps])  # a tree page is not the request's to free
    with pytest.raises(SlotError, match="tree-owned"):
        alloc.check_request_held(req[ps : 3 * ps])
    with pytest.raises(SlotError, match="request-held"):
        alloc.free_tree(req[2 * ps :])
    with pytest.raises(SlotError, match="twice"):
        alloc.commit_request(req[2 * ps : 3 * ps], req[2 * ps : 3 * ps])
    assert alloc.counts() == (4 * ps, 2 * ps, 2 * ps)  # nothing changed by the refusals
    alloc.commit_request(req[2 * ps : 3 * ps], req[3 * ps :])
    assert alloc.counts() == (5 * ps, 0, 3 * ps) and alloc.request_held() == 0
    alloc.free_tree(req[: 3 * ps])
    assert alloc.counts() == (8 * ps, 0, 0) and alloc.available() == 8 * ps
    with pytest.raises(SlotError, match="free"):
        alloc.free_tree(req[:ps])


def test_out_of_range_and_misaligned_slots_are_refused() -> None:
    alloc = PagedAllocator(64, 16)
    slots = alloc.alloc(32)
    assert slots is not None
    with pytest.raises(SlotError, match="range"):
        alloc.check_request_held(slots + 64)
    with pytest.raises(SlotError, match="whole pages"):
        alloc.check_request_held(slots + 1)
    with pytest.raises(SlotError, match="whole pages"):
        alloc.check_request_held(slots.flip(0))
    with pytest.raises(TypeError):
        alloc.alloc(1.5)  # type: ignore[arg-type]
    alloc.free_request(slots)
    assert alloc.available() == 64


def test_allocator_names_the_failed_check_for_numpy_slots() -> None:
    """Slots from the tree arrive as numpy: the same checks, the same errors."""
    alloc = PagedAllocator(64, 4)
    held = alloc.alloc(8)
    assert held is not None
    with pytest.raises(SlotError, match="range"):
        alloc.check_request_held(held.numpy() + 64)
    with pytest.raises(SlotError, match="range"):
        alloc.check_request_held(held.numpy() - 64)
    with pytest.raises(SlotError, match="whole pages"):
        alloc.check_request_held(held.numpy()[::-1].copy())
    with pytest.raises(SlotError, match="twice"):
        alloc.commit_request(held.numpy()[:4], held.numpy()[:4])
    with pytest.raises(SlotError):
        alloc.check_request_held(held.numpy().astype(np.int32))
    alloc.commit_request(held.numpy()[:4], held.numpy()[4:])  # nothing changed before
    assert alloc.counts().tree == 4 and alloc.counts().free == 60


def test_page_slots_names_a_page_read_only_and_refuses_outside_slots() -> None:
    alloc = PagedAllocator(64, 16)
    assert alloc.page_slots(37).tolist() == list(range(32, 48))
    assert alloc.page_slots(0).tolist() == list(range(16))
    with pytest.raises(ValueError):  # a view of the allocator's grid: never written
        alloc.page_slots(5)[0] = 1
    for slot in (-1, 64, 1000):
        with pytest.raises(SlotError, match="outside the pool"):
            alloc.page_slots(slot)
    assert alloc.counts() == (64, 0, 0)
