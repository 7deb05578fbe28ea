"""The CUDA engine's staged piece copies, run on CPU through a staging ring.

transfer/cuda.py moves every piece with these four halves and this ring; only
the streams, events and the pinned slot differ on a GPU. Each case checks
bit-identity with a reference indexed copy, across attention kinds, host
layouts, page sizes, dtypes, and slot sizes that cut a layer into one or
several pieces.
"""

from __future__ import annotations

import pytest
import torch

from tests.transfer.transfer_helpers import (
    make_pools,
    make_shape,
    random_pages,
    randomize,
    same,
    snapshot,
)
from transfer.base import TransferOp
from transfer.pieces import (
    gather_from_device,
    gather_from_host,
    scatter_to_device,
    scatter_to_host,
    stage_view,
    sub_plan,
)
from transfer.plan import CopyPlan, make_plan
from transfer.staging import SLOT_ALIGN, StagingRing, block_ranges


class Done:
    def synchronize(self) -> None:
        pass


def plan_of(kind: str, dev, host, dev_slots: torch.Tensor, host_slots: torch.Tensor) -> CopyPlan:
    op = TransferOp(kind, dev_slots, host_slots)  # type: ignore[arg-type]
    return make_plan(op, dev.size, dev.page_size, host.size, host.page_size)


def pieces(dev, plan: CopyPlan, ring: StagingRing) -> list[range]:
    row = plan.block_tokens * dev.shape.bytes_per_token_layer  # all buffers of a block
    return block_ranges(plan.device_blocks.numel(), row, ring.slot_bytes)


def stage(dev, plan: CopyPlan, blocks: range, ring: StagingRing) -> tuple[int, torch.Tensor]:
    kv = dev.shape.kv_per_layer
    nbytes = len(blocks) * plan.block_tokens * dev.shape.bytes_per_token_layer
    index, raw = ring.acquire(nbytes)
    return index, stage_view(raw, dev.shape.dtype, kv, len(blocks))


def backup(dev, host, plan: CopyPlan, ring: StagingRing) -> None:
    for layer in range(dev.shape.num_layers):
        for blocks in pieces(dev, plan, ring):
            index, slot = stage(dev, plan, blocks, ring)
            src = plan.device_blocks[blocks.start : blocks.stop]
            gather_from_device(dev, layer, plan, src, slot)
            part = sub_plan(plan, blocks)

            def scatter(layer: int = layer, part: CopyPlan = part, slot: torch.Tensor = slot):
                scatter_to_host(host, layer, part, slot)

            ring.commit(index, Done(), scatter)
    ring.flush()


def load(dev, host, plan: CopyPlan, ring: StagingRing) -> None:
    for layer in range(dev.shape.num_layers):
        for blocks in pieces(dev, plan, ring):
            index, slot = stage(dev, plan, blocks, ring)
            gather_from_host(host, layer, sub_plan(plan, blocks), slot)
            dst = plan.device_blocks[blocks.start : blocks.stop]
            scatter_to_device(dev, layer, plan, dst, slot.clone())  # clone: the "H2D copy"
            ring.commit(index, Done(), None)


@pytest.mark.parametrize("blocks_per_slot", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_staged_pieces_round_trip_bit_exact(
    attention: str, layout: str, page_size: int, dtype: torch.dtype, blocks_per_slot: int
):
    dev, host = make_pools(make_shape(attention, dtype), page_size, layout)
    randomize(dev, seed=1)
    gen = torch.Generator().manual_seed(2)
    src, dst = random_pages(dev.size, page_size, 5, gen), random_pages(dev.size, page_size, 5, gen)
    host_slots = random_pages(host.size, page_size, 5, gen)
    want = snapshot(dev, src)
    out = plan_of("d2h", dev, host, src, host_slots)
    row = out.block_tokens * dev.shape.bytes_per_token_layer
    slot = max(SLOT_ALIGN, -(-row * blocks_per_slot // SLOT_ALIGN) * SLOT_ALIGN)
    ring = StagingRing(torch.zeros(4 * slot, dtype=torch.uint8), 4)
    backup(dev, host, out, ring)
    got = [list(host.read_layer(layer, host_slots)) for layer in range(dev.shape.num_layers)]
    assert same(got, want)
    load(dev, host, plan_of("h2d", dev, host, dst, host_slots), ring)
    assert same(snapshot(dev, dst), want)
