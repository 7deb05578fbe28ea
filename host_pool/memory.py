"""Host RAM budget: refuse allocations that would not fit, and allocate eagerly."""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)

_MEMINFO = "/proc/meminfo"


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


def allocate_host(shape: tuple[int, ...], dtype: torch.dtype, pin_memory: bool) -> torch.Tensor:
    """A zeroed CPU tensor whose pages are all resident (zeroing touches every page)."""
    if pin_memory and not torch.cuda.is_available():
        raise ValueError("pin_memory=True needs CUDA, which is not available")
    tensor = torch.empty(shape, dtype=dtype, pin_memory=pin_memory)
    tensor.zero_()
    return tensor
