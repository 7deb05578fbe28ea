"""KV blocks as byte rows of numpy arrays, and a cache-friendly scattered row copy."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from transfer.plan import CopyPlan

# Gathered rows are staged in a buffer this size: small enough to stay in the
# last-level cache until they are scattered, large enough that each numpy call
# (which releases the GIL) is long enough for two workers to overlap.
SCRATCH_BYTES = 2 << 20
# Rows at least this long are copied one by one: a memcpy per row moves each
# byte once, where gather-then-scatter moves it twice; below this size the
# per-row Python overhead costs more than the second pass.
ROW_LOOP_BYTES = 16 << 10


class Rows(NamedTuple):
    """``array[index]`` selects the plan's blocks, one byte row each."""

    array: np.ndarray
    index: tuple[np.ndarray, ...]  # type: ignore[assignment]  # shadows tuple.index


def as_bytes(t: torch.Tensor) -> np.ndarray:
    """A numpy uint8 view of a CPU tensor whose last dim is contiguous (no copy)."""
    return t.view(torch.uint8).numpy()


def device_rows(buf: torch.Tensor, plan: CopyPlan) -> Rows:
    """Rows of a ``[size, *token_shape]`` device buffer, one per plan block."""
    rows = buf.view(buf.shape[0] // plan.block_tokens, -1)
    return Rows(as_bytes(rows), (plan.device_blocks.numpy(),))


def host_rows(pages: torch.Tensor, plan: CopyPlan) -> Rows:
    """Rows of a host ``[num_pages, page_size, *token_shape]`` view, one per plan block."""
    per_page = pages.shape[1] // plan.block_tokens
    blocks = pages.view(pages.shape[0], per_page, -1)
    if per_page == 1:
        return Rows(as_bytes(blocks[:, 0]), (plan.host_pages.numpy(),))
    if blocks.is_contiguous():
        flat = blocks.view(-1, blocks.shape[2])
        return Rows(as_bytes(flat), ((plan.host_pages * per_page + plan.host_offsets).numpy(),))
    return Rows(as_bytes(blocks), (plan.host_pages.numpy(), plan.host_offsets.numpy()))


def copy_rows(dst: Rows, src: Rows, scratch_bytes: int = SCRATCH_BYTES) -> None:
    """``dst.array[dst.index] = src.array[src.index]``, in L2-sized chunks.

    numpy's fancy get/set copy whole rows with memcpy and release the GIL,
    so several workers copy in parallel. Indices must already be in range.
    """
    n = len(src.index[0])
    if n == 0:
        return
    row_bytes = src.array.shape[-1]
    if row_bytes >= ROW_LOOP_BYTES:
        _copy_row_by_row(dst, src)
        return
    chunk = max(1, scratch_bytes // row_bytes)
    if len(src.index) > 1 or not src.array.flags.c_contiguous:
        # No take() here: a fancy get makes the chunk's temporary itself.
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            src_part = src.array[tuple(i[lo:hi] for i in src.index)]
            dst.array[tuple(i[lo:hi] for i in dst.index)] = src_part
        return
    scratch = np.empty((min(chunk, n), row_bytes), dtype=np.uint8)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        part = scratch[: hi - lo]
        gather_rows(src.array, tuple(i[lo:hi] for i in src.index), part)
        dst.array[tuple(i[lo:hi] for i in dst.index)] = part


def _copy_row_by_row(dst: Rows, src: Rows) -> None:
    d_arr, s_arr = dst.array, src.array
    d_idx = zip(*(i.tolist() for i in dst.index), strict=True)
    s_idx = zip(*(i.tolist() for i in src.index), strict=True)
    for d, s in zip(d_idx, s_idx, strict=True):
        d_arr[d] = s_arr[s]


def gather_rows(array: np.ndarray, index: tuple[np.ndarray, ...], out: np.ndarray) -> None:
    """``out[:] = array[index]`` without a temporary where numpy allows it."""
    if len(index) == 1 and array.flags.c_contiguous:
        # mode="clip" lets take() write into ``out`` directly ("raise" buffers);
        # indices were range-checked when the plan was made. take() would copy
        # a strided array whole first, hence the contiguity test.
        np.take(array, index[0], axis=0, out=out, mode="clip")
    else:
        out[...] = array[index]
