"""Moving KV bytes between the device and host pools (CPU threads or CUDA streams)."""

from __future__ import annotations

from typing import Literal

from device_pool.kv_pool import DeviceKVPool
from host_pool.kv_pool import HostKVPool
from transfer.base import Completion, TransferEngine, TransferError, TransferKind, TransferOp
from transfer.cpu import CpuTransferEngine
from transfer.faults import FaultInjection, InjectedFault

BACKENDS: tuple[str, ...] = ("auto", "cpu", "cuda")


def create_transfer_engine(
    device_pool: DeviceKVPool,
    host_pool: HostKVPool,
    backend: str = "auto",
    num_workers: int = 1,
    faults: FaultInjection | None = None,
    io_backend: Literal["direct", "kernel"] = "direct",
) -> TransferEngine:
    """Build the engine for a pool pair.

    ``auto`` picks ``cuda`` when the device pool lives on CUDA, else ``cpu``.
    ``num_workers`` and ``faults`` apply to the CPU engine, ``io_backend`` to
    the CUDA one. Raises ValueError for an unknown backend, ``cuda`` on a CPU
    pool (or ``cpu`` on a CUDA pool), and fault injection on CUDA.
    """
    if backend not in BACKENDS:
        raise ValueError(f"transfer backend must be one of {BACKENDS}, got {backend!r}")
    on_cuda = device_pool.device.type == "cuda"
    if backend == "auto":
        backend = "cuda" if on_cuda else "cpu"
    if backend == "cpu":
        return CpuTransferEngine(device_pool, host_pool, num_workers=num_workers, faults=faults)
    if not on_cuda:
        raise ValueError(f"backend 'cuda' needs a CUDA device pool, got {device_pool.device}")
    if faults is not None:
        raise ValueError("fault injection is only supported by the cpu backend")
    from transfer.cuda import CudaTransferEngine  # keeps CUDA-only code off the CPU path

    return CudaTransferEngine(device_pool, host_pool, io_backend=io_backend)


__all__ = [
    "BACKENDS",
    "Completion",
    "CpuTransferEngine",
    "FaultInjection",
    "InjectedFault",
    "TransferEngine",
    "TransferError",
    "TransferKind",
    "TransferOp",
    "create_transfer_engine",
]
