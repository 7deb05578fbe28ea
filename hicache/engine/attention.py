"""Causal attention of new tokens over a whole gathered context, batch-invariant.

Keys are visited in fixed blocks aligned to absolute positions, with an online
softmax (running max, running sum, running weighted values). A query at
position ``p`` thus sees the same blocks, in the same order, with the same
arithmetic, whether it is computed alone, in a chunk of a prefill, or in a full
recompute: blocks past ``p`` are either skipped or fully masked, and a fully
masked block changes nothing (its weights are exactly zero and its rescale
factor exactly one). Together with ``hicache.engine.invariant`` this makes the
output for a token independent of what else is computed with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hicache.engine.invariant import ROW_TILE, exp, pad_rows, padded_len


@dataclass
class _Softmax:
    """Online-softmax state per head and query row (mutated block by block)."""

    m: torch.Tensor  # running max, [heads, rows, 1]
    total: torch.Tensor  # running sum of weights, [heads, rows, 1]
    acc: torch.Tensor  # running weighted values, [heads, rows, head_dim]


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, block: int
) -> torch.Tensor:
    """Attention of ``q`` ([n, heads, head_dim], positions ``start..start+n``)
    over keys/values ``k``, ``v`` ([L, kv_heads, head_dim], positions ``0..L``,
    ``L >= start + n``). Grouped-query: ``heads`` is a multiple of ``kv_heads``.
    Computes in float32; returns [n, heads, head_dim] float32. Pure."""
    n, heads, dim = q.shape
    if heads % k.shape[1] or k.shape[0] < start + n:
        raise ValueError("heads must be a multiple of kv_heads and keys must cover the queries")
    rows = padded_len(n)
    qh = pad_rows(q.float()).permute(1, 0, 2).contiguous() * (1.0 / math.sqrt(dim))
    kb = _blocks(k, heads, block)
    vb = _blocks(v, heads, block)
    qpos = (start + torch.arange(rows, device=q.device)).clamp(max=start + n - 1)
    kpos = torch.arange(kb.shape[0] * block, device=q.device).view(-1, block)
    state = _first_block(qh, kb[0], vb[0], qpos[:, None] < kpos[0][None, :])
    for j in range(1, kb.shape[0]):
        first = j * block - start  # first query row that sees block j
        if first >= n:
            break
        a = max(first, 0) // ROW_TILE * ROW_TILE
        mask = qpos[a:, None] < kpos[j][None, :]
        _next_block(state, qh[:, a:].contiguous(), kb[j], vb[j], mask, a)
    out = state.acc / state.total
    return out[:, :n].permute(1, 0, 2)


def _blocks(x: torch.Tensor, heads: int, block: int) -> torch.Tensor:
    """[L, kv_heads, d] -> [blocks, heads, block, d] float32, zero-padded, one
    contiguous [heads, block, d] matrix per block."""
    x = pad_rows(x.float(), block)
    x = x.repeat_interleave(heads // x.shape[1], dim=1)
    return x.view(-1, block, heads, x.shape[2]).permute(0, 2, 1, 3).contiguous()


def _scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.matmul(q, k.transpose(1, 2)).masked_fill(mask, -math.inf)


def _first_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> _Softmax:
    # Every query sees key 0, so each row's max is finite from here on.
    s = _scores(q, k, mask)
    m = s.amax(dim=-1, keepdim=True)
    p = exp(s - m)
    return _Softmax(m, p.sum(dim=-1, keepdim=True), torch.matmul(p, v))


def _next_block(
    state: _Softmax,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    a: int,
) -> None:
    """Fold one more key block into the rows ``a:`` of ``state``."""
    s = _scores(q, k, mask)
    m_old = state.m[:, a:]
    m_new = torch.maximum(m_old, s.amax(dim=-1, keepdim=True))
    alpha = exp(m_old - m_new)
    p = exp(s - m_new)
    state.total[:, a:] = state.total[:, a:] * alpha + p.sum(dim=-1, keepdim=True)
    state.acc[:, a:] = state.acc[:, a:] * alpha + torch.matmul(p, v)
    state.m[:, a:] = m_new
