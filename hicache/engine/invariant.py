"""Batch-invariant numerics: a token's result never depends on its batch.

Cached KV gives bit-identical outputs to a full recompute only if the KV
computed for a token in one forward pass is, bit for bit, what another pass
would compute, although the two batch the token with different neighbours
(other requests, other chunk boundaries). On CPU two things break that:

* GEMM kernels pick different code paths (and reduction orders) for small row
  counts (with torch 2.13 + MKL: 1-3, 5-7 and 9-11 rows differ from the rest).
  Padding the row count to a multiple of ``ROW_TILE`` keeps every call on
  the same path, where a row's result depends only on the row.
* ATen may compute the last, partial SIMD step of an element-wise loop with
  the scalar function (measured for ``silu``), and the parallel split moves
  that tail around with the tensor's size. ``exp`` and ``silu`` pad their
  input and apply the op to pieces too small to be split across threads, so
  every element takes the vectorised path.

Additions, multiplications, divisions and square roots are correctly rounded
on every path and need neither measure.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

ROW_TILE = 16
_LANES = 64  # a whole number of SIMD steps for every dtype and vector width
_PIECE = 16384  # elements per call: under ATen's parallel grain (32768), so one thread


def padded_len(n: int, multiple: int = ROW_TILE) -> int:
    """``n`` rounded up to a multiple of ``multiple``."""
    return -(-n // multiple) * multiple


def pad_rows(x: torch.Tensor, multiple: int = ROW_TILE) -> torch.Tensor:
    """``x`` with zero rows appended up to a multiple of ``multiple`` rows (a new tensor)."""
    extra = padded_len(x.shape[0], multiple) - x.shape[0]
    if extra == 0:
        return x.contiguous()
    return torch.cat([x, x.new_zeros((extra, *x.shape[1:]))])


def exp(x: torch.Tensor) -> torch.Tensor:
    """``torch.exp(x)``, computed the same way for every element (a new tensor)."""
    return _pointwise(torch.Tensor.exp_, x)


def silu(x: torch.Tensor) -> torch.Tensor:
    """``F.silu(x)``, computed the same way for every element (a new tensor)."""
    return _pointwise(_silu_, x)


def _silu_(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x, inplace=True)


def _pointwise(op_: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Apply the in-place element-wise ``op_`` to a padded copy of ``x``, one
    single-threaded piece at a time, so that no element falls in a scalar tail."""
    n = x.numel()
    size = padded_len(n, _LANES)
    buf = torch.empty(size, dtype=x.dtype, device=x.device)
    buf[:n] = x.reshape(-1)
    buf[n:] = 0
    for lo in range(0, size, _PIECE):
        op_(buf[lo : lo + _PIECE])
    return buf[:n].view(x.shape)
