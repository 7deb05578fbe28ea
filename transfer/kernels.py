"""cupy kernel that copies many KV blocks of many layers in one launch.

The host pool is reached through its device-mapped (UVA) address, so a
launch reads or writes pinned host memory directly: no staging buffer, no
per-page ``cudaMemcpyAsync``. cupy is imported when a kernel is built, never
at module import.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType

import numpy as np
import torch

from device_pool.kv_pool import DeviceKVPool
from host_pool.kv_pool import HostKVPool
from host_pool.memory import register_host, unregister_host
from transfer.plan import CopyPlan

_SOURCE = r"""
extern "C" __global__ void hicache_copy_blocks(
    const long long* __restrict__ dev_ptrs,        // [buffers] device buffer addresses
    const long long* __restrict__ host_buf_off,    // [buffers] buffer offset in host data
    const long long* __restrict__ dev_blocks,      // [blocks] block index in a device buffer
    const long long* __restrict__ host_block_off,  // [blocks] block offset in a host buffer
    long long host_base, long long block_bytes, int first_buf, int to_host)
{
    const long long i = blockIdx.x;
    const int j = first_buf + blockIdx.y;
    char* dev = (char*)dev_ptrs[j] + dev_blocks[i] * block_bytes;
    char* host = (char*)host_base + host_buf_off[j] + host_block_off[i];
    char* dst = to_host ? host : dev;
    const char* src = to_host ? dev : host;
    if ((((unsigned long long)dst | (unsigned long long)src | block_bytes) & 15) == 0) {
        int4* d = (int4*)dst;
        const int4* s = (const int4*)src;
        for (long long t = threadIdx.x; t < block_bytes / 16; t += blockDim.x) d[t] = s[t];
    } else {
        for (long long t = threadIdx.x; t < block_bytes; t += blockDim.x) dst[t] = src[t];
    }
}
"""
_THREADS = 256


def indexed_device(device: torch.device) -> torch.device:
    """``device`` with its index fixed (an index-less ``cuda`` is the current device now)."""
    if device.type != "cuda" or device.index is not None:
        return device
    return torch.device("cuda", torch.cuda.current_device())


def import_cupy() -> ModuleType:
    """cupy, or a RuntimeError that says how to get it."""
    try:
        return importlib.import_module("cupy")
    except ImportError as exc:
        raise RuntimeError(
            "io_backend='kernel' needs cupy (pip install 'hicache[cuda]'); "
            "use io_backend='direct' without it"
        ) from exc


class BlockCopyKernel:
    """Launches block copies between a CUDA device pool and a (mapped) host pool.

    Buffer ``j = layer * kv_per_layer + k``. Thread-safe: the kernel is
    compiled at construction and launches are serialised by a lock, so the
    engine's backup and load lanes may both launch. The host pool is
    registered with CUDA if it is not pinned already; ``close`` unregisters
    it. Everything device-specific (mapping, tables, compile) happens inside
    the pool's device context. Raises RuntimeError without cupy or when host
    memory cannot be mapped.
    """

    def __init__(self, device_pool: DeviceKVPool, host_pool: HostKVPool) -> None:
        self._cp = import_cupy()
        self._device = indexed_device(device_pool.device)
        self._kv = device_pool.shape.kv_per_layer
        self._host_data = host_pool.data
        self._registered = False
        self._lock = threading.Lock()
        with torch.cuda.device(self._device), self._cp.cuda.Device(self._device.index):
            self._setup(device_pool, host_pool)

    def _setup(self, device_pool: DeviceKVPool, host_pool: HostKVPool) -> None:
        self._host_base = self._map_host()
        layers = range(device_pool.shape.num_layers)
        dev_bufs = [b for layer in layers for b in device_pool.layer_buffers(layer)]
        host_views = [v for layer in layers for v in host_pool.layer_pages(layer)]
        base = self._host_data.data_ptr()
        self._dev_ptrs = self._table([b.data_ptr() for b in dev_bufs])
        self._host_buf_off = self._table([v.data_ptr() - base for v in host_views])
        elem = self._host_data.element_size()
        self._page_stride = host_views[0].stride(0) * elem
        self._token_bytes = host_views[0][0, 0].numel() * elem
        self._kernel = self._cp.RawKernel(_SOURCE, "hicache_copy_blocks")
        # Compiled now, not lazily at a first launch that two lanes could race to.
        compile_now = getattr(self._kernel, "compile", None)
        if compile_now is not None:
            compile_now()
        else:  # older cupy: reading the function object compiles it
            _ = self._kernel.kernel
        # The tables were copied on the current stream; launches use another.
        torch.cuda.current_stream(self._device).synchronize()

    def _table(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self._device)

    def _map_host(self) -> int:
        runtime = self._cp.cuda.runtime
        ptr = self._host_data.data_ptr()
        if not self._host_data.is_pinned():
            register_host(self._host_data)
            self._registered = True
        dev_ptr = int(runtime.pointerGetAttributes(ptr).devicePointer)
        if dev_ptr == 0:
            raise RuntimeError("host pool memory is not mapped into the device address space")
        return dev_ptr

    def host_offsets(self, plan: CopyPlan) -> torch.Tensor:
        """Byte offset of each plan block inside one host buffer (CPU tensor)."""
        block_bytes = plan.block_tokens * self._token_bytes
        return plan.host_pages * self._page_stride + plan.host_offsets * block_bytes

    def launch(
        self,
        plan: CopyPlan,
        dev_blocks: torch.Tensor,
        host_offsets: torch.Tensor,
        to_host: bool,
        layers: range,
        stream: torch.cuda.Stream,
    ) -> None:
        """Copy the plan's blocks of ``layers`` on ``stream``; index tensors live on the device."""
        n = dev_blocks.numel()
        if n == 0 or len(layers) == 0:
            return
        args = (
            np.int64(self._dev_ptrs.data_ptr()),
            np.int64(self._host_buf_off.data_ptr()),
            np.int64(dev_blocks.data_ptr()),
            np.int64(host_offsets.data_ptr()),
            np.int64(self._host_base),
            np.int64(plan.block_tokens * self._token_bytes),
            np.int32(layers.start * self._kv),
            np.int32(1 if to_host else 0),
        )
        grid = (n, len(layers) * self._kv, 1)
        with (
            self._lock,
            self._cp.cuda.Device(self._device.index),
            self._cp.cuda.ExternalStream(stream.cuda_stream),
        ):
            self._kernel(grid, (_THREADS, 1, 1), args)

    def close(self) -> None:
        """Unregister host memory this kernel registered (copies must be finished)."""
        if self._registered:
            unregister_host(self._host_data)
            self._registered = False
