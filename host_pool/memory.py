"""Host RAM budget, eager allocation, and page-locking memory with CUDA.

Pinned memory is pageable memory registered with ``cudaHostRegister``, not a
``pin_memory=True`` allocation: torch's caching host allocator rounds each
request up to a power of two before pinning, so a 40 GiB pool would pin 64
GiB while the budget check saw 40. Registration pins exactly the pages of the
buffer, which is what ``check_host_memory`` is asked about.
"""

from __future__ import annotations

import logging
import mmap
import os

import torch

logger = logging.getLogger(__name__)

_MEMINFO = "/proc/meminfo"
# cudaHostRegisterPortable | cudaHostRegisterMapped: usable from every
# context, and reachable through a device pointer (the cupy kernels need it).
_REGISTER_FLAGS = 0x01 | 0x02


class HostMemoryError(ValueError):
    """A host buffer would not fit in the RAM that is available right now."""


def available_host_memory() -> int:
    """Bytes of RAM the kernel could hand out now (MemAvailable, else free pages)."""
    try:
        with open(_MEMINFO, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError as exc:
        logger.debug("cannot read %s (%s); using sysconf", _MEMINFO, exc)
    # Kernels without MemAvailable (or no /proc): free pages is a lower bound.
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def pinned_size(nbytes: int) -> int:
    """Bytes that registering ``nbytes`` locks: whole OS pages."""
    return -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE


def check_host_memory(nbytes: int, reserve_bytes: int) -> None:
    """Raise HostMemoryError unless ``nbytes`` fits in available RAM minus a reserve."""
    available = available_host_memory()
    budget = available - reserve_bytes
    if nbytes > budget:
        raise HostMemoryError(
            f"host KV pool needs {nbytes / 2**30:.2f} GiB but only {available / 2**30:.2f} GiB "
            f"is available ({max(budget, 0) / 2**30:.2f} GiB after keeping "
            f"{reserve_bytes / 2**30:.2f} GiB in reserve); shrink the host pool"
        )


def allocate_host(
    shape: tuple[int, ...], dtype: torch.dtype, page_aligned: bool = False
) -> torch.Tensor:
    """A zeroed, pageable CPU tensor whose pages are all resident (zeroing touches them).

    ``page_aligned``: the memory is whole pages of its own (an anonymous
    mapping), as registration needs: two registered buffers that shared a
    page would make the second ``cudaHostRegister`` fail.
    """
    if not page_aligned:
        return torch.empty(shape, dtype=dtype).zero_()
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    # The tensor keeps the mapping alive; the mapping is zero-filled already.
    raw = torch.frombuffer(
        mmap.mmap(-1, max(pinned_size(nbytes), mmap.PAGESIZE)), dtype=torch.uint8
    )
    tensor = raw[:nbytes].view(dtype).view(shape)
    tensor.zero_()
    return tensor


def register_host(tensor: torch.Tensor) -> int:
    """Page-lock ``tensor``'s memory with CUDA; returns the bytes locked.

    The caller must call ``unregister_host`` before the memory is freed.
    Raises ValueError without CUDA, RuntimeError when CUDA refuses.
    """
    if not torch.cuda.is_available():
        raise ValueError("pin_memory=True needs CUDA, which is not available")
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return 0
    err = int(torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), nbytes, _REGISTER_FLAGS))
    if err != 0:
        raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed with cudaError {err}")
    return pinned_size(nbytes)


def unregister_host(tensor: torch.Tensor) -> None:
    """Undo ``register_host``; copies that use the memory must have finished."""
    err = int(torch.cuda.cudart().cudaHostUnregister(tensor.data_ptr()))
    if err != 0:
        logger.warning("cudaHostUnregister failed with cudaError %d", err)


class PinnedRegistration:
    """Keeps a registered tensor alive until it is unregistered, once.

    ``release`` is idempotent and is also what a ``weakref.finalize`` of the
    owner calls, so registered memory is never freed while still locked.
    """

    def __init__(self, tensor: torch.Tensor, pin: bool) -> None:
        self._tensor: torch.Tensor | None = tensor
        self.nbytes = register_host(tensor) if pin else 0

    def release(self) -> None:
        tensor, self._tensor = self._tensor, None
        if tensor is not None and self.nbytes:
            unregister_host(tensor)
        self.nbytes = 0
