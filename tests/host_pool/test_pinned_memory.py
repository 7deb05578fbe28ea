"""Host memory for pinning: page-aligned allocation and the registration record (CPU side).

The registration itself needs CUDA: tests/transfer/test_cuda_engine.py checks
there that a pinned pool locks exactly its own bytes.
"""

from __future__ import annotations

import mmap

import pytest
import torch

from device_pool.shape import KVShape
from host_pool.kv_pool import HostKVPool
from host_pool.memory import PinnedRegistration, allocate_host, pinned_size, register_host


@pytest.mark.parametrize("shape", [(3, 5, 7), (1,), (4096,)])
def test_page_aligned_memory_is_whole_zeroed_pages_of_its_own(shape: tuple[int, ...]):
    a = allocate_host(shape, torch.float16, page_aligned=True)
    b = allocate_host(shape, torch.float16, page_aligned=True)
    assert a.shape == shape and a.dtype == torch.float16 and bool((a == 0).all())
    assert a.data_ptr() % mmap.PAGESIZE == 0 and b.data_ptr() % mmap.PAGESIZE == 0
    # No page holds bytes of both buffers.
    a_pages = {(a.data_ptr() + i) // mmap.PAGESIZE for i in (0, max(a.numel() * 2 - 1, 0))}
    b_pages = {(b.data_ptr() + i) // mmap.PAGESIZE for i in (0, max(b.numel() * 2 - 1, 0))}
    assert a_pages.isdisjoint(b_pages)
    a.fill_(1)  # writable, and alive after the allocator returned
    assert bool((b == 0).all())


def test_pinned_size_is_whole_pages():
    assert pinned_size(1) == mmap.PAGESIZE
    assert pinned_size(mmap.PAGESIZE) == mmap.PAGESIZE
    assert pinned_size(mmap.PAGESIZE + 1) == 2 * mmap.PAGESIZE


def test_an_unpinned_registration_locks_nothing():
    reg = PinnedRegistration(torch.zeros(8), pin=False)
    assert reg.nbytes == 0
    reg.release()
    reg.release()


def test_pageable_pool_reports_no_pinned_bytes_and_closes_twice():
    pool = HostKVPool(KVShape(2, 2, 8), 64, 16, reserve_bytes=0)
    assert pool.pinned_nbytes == 0 and not pool.is_pinned
    pool.close()
    pool.close()
    pool.write_layer(0, torch.arange(2), (torch.ones(2, 2, 8), torch.ones(2, 2, 8)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_pinning_without_cuda_is_refused_before_allocating():
    with pytest.raises(ValueError, match="CUDA"):
        HostKVPool(KVShape(2, 2, 8), 64, 16, pin_memory=True, reserve_bytes=0)
    with pytest.raises(ValueError, match="CUDA"):
        register_host(torch.zeros(8))


def test_an_empty_page_aligned_buffer():
    assert allocate_host((0,), torch.float32, page_aligned=True).numel() == 0
