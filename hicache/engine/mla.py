"""Multi-head latent attention (DeepSeek-style) over a paged latent KV pool.

Per token and layer the pool keeps what DeepSeek-V2/V3 keep: one compressed
latent ``c_kv`` (``kv_lora_rank`` values, RMS-normalised) and one decoupled
rotary key ``k_pe`` (``rope_dim`` values, shared by every head), side by side
in the pool's ``[1, kv_lora_rank + rope_dim]`` entry. Attention expands the
latent of the whole context into per-head keys and values with the
up-projections, then runs the same batch-invariant causal attention as MHA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hicache.engine.invariant import pad_rows


@dataclass(frozen=True)
class MlaWeights:
    """One layer's attention weights (``d`` = head_dim, ``r`` = rope_dim)."""

    wq: torch.Tensor  # [hidden, heads * (d + r)]
    wkv_a: torch.Tensor  # [hidden, kv_lora_rank + r]: latent and rotary key
    kv_norm: torch.Tensor  # [kv_lora_rank]
    w_uk: torch.Tensor  # [kv_lora_rank, heads * d]
    w_uv: torch.Tensor  # [kv_lora_rank, heads * d]


def expand(
    latent: torch.Tensor, w: MlaWeights, heads: int, head_dim: int, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head keys ``[L, heads, d + r]`` and values ``[L, heads, d]`` from
    ``latent`` ``[L, 1, rank + r]`` (pool entries). Rows are padded for the
    GEMMs, so a row's result does not depend on the context length."""
    n = latent.shape[0]
    flat = pad_rows(latent.reshape(n, -1).to(w.w_uk.dtype))
    c_kv, k_pe = flat[:, :rank], flat[:, rank:]
    k_nope = (c_kv @ w.w_uk)[:n].reshape(n, heads, head_dim)
    v = (c_kv @ w.w_uv)[:n].reshape(n, heads, head_dim)
    k_pe = k_pe[:n, None, :].expand(n, heads, k_pe.shape[1])
    return torch.cat([k_nope.float(), k_pe.float()], dim=-1), v
