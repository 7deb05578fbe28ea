"""The staged copy of one piece: a run of plan blocks of one layer through a staging slot.

The CUDA engine moves each piece in two halves, one on each side of a
staging slot: d2h gathers device blocks into the slot (on the GPU) and later
scatters the slot into host pages (numpy); h2d gathers host pages into the
slot and scatters it into device blocks. The four halves work on any torch
device, so the CPU test suite runs exactly the code the CUDA engine runs.
A slot holds ``[kv_per_layer, blocks, block elements]``.
"""

from __future__ import annotations

import dataclasses

import torch

from device_pool.kv_pool import DeviceKVPool
from host_pool.kv_pool import HostKVPool
from transfer.plan import CopyPlan
from transfer.rows import as_bytes, gather_rows, host_rows


def sub_plan(plan: CopyPlan, blocks: range) -> CopyPlan:
    """The part of ``plan`` made of ``blocks`` (consecutive block numbers)."""
    lo, hi = blocks.start, blocks.stop
    return dataclasses.replace(
        plan,
        device_blocks=plan.device_blocks[lo:hi],
        host_pages=plan.host_pages[lo:hi],
        host_offsets=plan.host_offsets[lo:hi],
        num_tokens=(hi - lo) * plan.block_tokens,
    )


def block_view(buf: torch.Tensor, plan: CopyPlan) -> torch.Tensor:
    """A ``[size, *token_shape]`` device buffer as one row per block."""
    return buf.view(buf.shape[0] // plan.block_tokens, -1)


def stage_view(raw: torch.Tensor, dtype: torch.dtype, kv: int, blocks: int) -> torch.Tensor:
    """A uint8 staging slot seen as ``[kv, blocks, block elements]`` of ``dtype``."""
    return raw.view(dtype).view(kv, blocks, -1)


def gather_from_device(
    pool: DeviceKVPool, layer: int, plan: CopyPlan, dev_blocks: torch.Tensor, out: torch.Tensor
) -> None:
    """``out[k] = layer's buffer k at dev_blocks`` (on the pool's device)."""
    for k, buf in enumerate(pool.layer_buffers(layer)):
        torch.index_select(block_view(buf, plan), 0, dev_blocks, out=out[k])


def scatter_to_device(
    pool: DeviceKVPool, layer: int, plan: CopyPlan, dev_blocks: torch.Tensor, src: torch.Tensor
) -> None:
    """Layer's buffer k at ``dev_blocks`` ``= src[k]`` (on the pool's device)."""
    for k, buf in enumerate(pool.layer_buffers(layer)):
        block_view(buf, plan).index_copy_(0, dev_blocks, src[k])


def gather_from_host(pool: HostKVPool, layer: int, part: CopyPlan, out: torch.Tensor) -> None:
    """``out[k]`` (a host slot) ``=`` the host rows of ``part`` in buffer k of ``layer``."""
    for k, pages in enumerate(pool.layer_pages(layer)):
        rows = host_rows(pages, part)
        gather_rows(rows.array, rows.index, as_bytes(out[k]))


def scatter_to_host(pool: HostKVPool, layer: int, part: CopyPlan, src: torch.Tensor) -> None:
    """The host rows of ``part`` in buffer k of ``layer`` ``= src[k]`` (a host slot)."""
    for k, pages in enumerate(pool.layer_pages(layer)):
        rows = host_rows(pages, part)
        rows.array[rows.index] = as_bytes(src[k])
