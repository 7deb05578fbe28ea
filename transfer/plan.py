"""Turn an op's token slots into the largest contiguous blocks both pools share."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from transfer.base import TransferOp


@dataclass(frozen=True, eq=False)
class CopyPlan:
    """An op as ``n`` blocks of ``block_tokens`` consecutive tokens on both sides.

    Block ``i`` is device block ``device_blocks[i]`` (tokens ``[b*B, (b+1)*B)``)
    and, on the host, sub-block ``host_offsets[i]`` of host page
    ``host_pages[i]``. Copying whole blocks instead of tokens is what makes
    scattered pages nearly as fast as one contiguous copy.
    """

    block_tokens: int
    device_blocks: torch.Tensor
    host_pages: torch.Tensor
    host_offsets: torch.Tensor
    num_tokens: int


def make_plan(
    op: TransferOp,
    device_size: int,
    device_page: int,
    host_size: int,
    host_page: int,
) -> CopyPlan:
    """Validate slot ranges (ValueError) and pick the block size for ``op``."""
    dev, host = op.device_slots.cpu(), op.host_slots.cpu()
    _check_range(dev, device_size, "device")
    _check_range(host, host_size, "host")
    block = 1
    for candidate in sorted({host_page, math.gcd(host_page, device_page)}, reverse=True):
        if device_size % candidate == 0 and _aligned(dev, candidate) and _aligned(host, candidate):
            block = candidate
            break
    host_blocks = host[::block] // block
    per_page = host_page // block
    return CopyPlan(
        block_tokens=block,
        device_blocks=dev[::block] // block,
        host_pages=host_blocks // per_page,
        host_offsets=host_blocks % per_page,
        num_tokens=dev.numel(),
    )


def _check_range(slots: torch.Tensor, size: int, side: str) -> None:
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= size):
        raise ValueError(f"{side} slot out of range [0, {size})")


def _aligned(slots: torch.Tensor, block: int) -> bool:
    """True when ``slots`` is a run of whole, aligned blocks of ``block`` tokens."""
    if block == 1:
        return True
    if slots.numel() % block:
        return False
    grid = slots.view(-1, block)
    starts = grid[:, :1]
    if bool((starts % block).any()):
        return False
    return torch.equal(grid, starts + torch.arange(block, dtype=torch.int64))
