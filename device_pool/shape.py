"""Per-token KV geometry of a model, shared by every pool that stores KV."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

AttentionKind = Literal["mha", "mla"]
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def dtype_from_name(name: str) -> torch.dtype:
    """Map a config dtype name to a torch dtype; ValueError for anything else."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}") from None


@dataclass(frozen=True)
class KVShape:
    """What one token's KV looks like in every layer.

    MHA stores K and V per layer, each ``[kv_heads, head_dim]``; MLA stores one
    latent vector per layer, ``[1, kv_lora_rank + rope_dim]``.
    """

    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float16
    attention: AttentionKind = "mha"
    kv_lora_rank: int = 0
    rope_dim: int = 0

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if self.dtype not in DTYPES.values():
            raise ValueError(f"dtype must be float32/float16/bfloat16, got {self.dtype}")
        if self.attention == "mha":
            if self.kv_heads < 1 or self.head_dim < 1:
                raise ValueError("MHA needs kv_heads >= 1 and head_dim >= 1")
        elif self.attention == "mla":
            if self.kv_lora_rank < 1 or self.rope_dim < 0:
                raise ValueError("MLA needs kv_lora_rank >= 1 and rope_dim >= 0")
        else:
            raise ValueError(f"attention must be 'mha' or 'mla', got {self.attention!r}")

    @property
    def kv_per_layer(self) -> int:
        """Buffers per layer: 2 (K, V) for MHA, 1 (latent) for MLA."""
        return 2 if self.attention == "mha" else 1

    @property
    def token_shape(self) -> tuple[int, int]:
        """Shape of one token's entry in one buffer of one layer."""
        if self.attention == "mha":
            return (self.kv_heads, self.head_dim)
        return (1, self.kv_lora_rank + self.rope_dim)

    @property
    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def bytes_per_token_layer(self) -> int:
        """Bytes of one token in one layer, all of that layer's buffers."""
        h, d = self.token_shape
        return self.kv_per_layer * h * d * self.element_size

    @property
    def bytes_per_token(self) -> int:
        """Bytes of one token across all layers and buffers."""
        return self.num_layers * self.bytes_per_token_layer
