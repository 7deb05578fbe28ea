"""The model a trace replay reports for, and the tiny one its pools hold.

A replay's hit rates do not depend on how many bytes a token's KV takes, only
its traffic does: the pools run a one-byte-wide geometry (``REPLAY_MODEL``, 4
bytes a token) and the report scales every token moved to the chosen model's
bytes per token (``--model``: a preset, or ``LAYERS/KV_HEADS/HEAD_DIM/DTYPE``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType

from hicache.config.cache import ModelConfig

# Bytes per element; fp8 is a KV-cache dtype of serving engines (report only:
# the pools never hold the chosen model's KV).
DTYPE_BYTES = MappingProxyType({"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1})
# The pools' geometry: 1 layer, 1 KV head of width 1, float16: 4 bytes a token,
# a 512-token page is 2 KiB. Keys chain from its fingerprint like any model's.
REPLAY_MODEL = ModelConfig(
    model_id="trace-replay", num_layers=1, kv_heads=1, head_dim=1, dtype="float16"
)
_CUSTOM = re.compile(r"^(\d+)/(\d+)/(\d+)/([a-z0-9]+)$")


@dataclass(frozen=True)
class ModelGeometry:
    """An MHA model's KV per token: K and V per layer, ``kv_heads × head_dim`` each."""

    name: str
    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    description: str = ""

    def __post_init__(self) -> None:
        for field in ("num_layers", "kv_heads", "head_dim"):
            if getattr(self, field) < 1:
                raise ValueError(f"--model: {field} must be >= 1, got {getattr(self, field)}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(
                f"--model: dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}"
            )

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]

    def summary(self) -> str:
        kib = self.bytes_per_token / 1024
        shape = (
            f"{self.num_layers} layers × {self.kv_heads} KV heads × {self.head_dim}, {self.dtype}"
        )
        return f"{self.name} ({shape}: {kib:,.0f} KiB of KV a token)"


MODEL_PRESETS = MappingProxyType(
    {
        "llama3-8b": ModelGeometry("llama3-8b", 32, 8, 128, "bfloat16", "Llama-3-8B-shaped, GQA"),
        "llama3-70b": ModelGeometry(
            "llama3-70b", 80, 8, 128, "bfloat16", "Llama-3-70B-shaped, GQA (Mooncake's model)"
        ),
    }
)
DEFAULT_MODEL = "llama3-70b"


def parse_model(text: str) -> ModelGeometry:
    """A preset's name or ``LAYERS/KV_HEADS/HEAD_DIM/DTYPE`` (e.g. ``80/8/128/bfloat16``);
    ValueError naming what is wrong."""
    if text in MODEL_PRESETS:
        return MODEL_PRESETS[text]
    match = _CUSTOM.match(text.strip().lower())
    if match is None:
        raise ValueError(
            f"--model {text!r}: a preset ({', '.join(MODEL_PRESETS)}) or "
            f"LAYERS/KV_HEADS/HEAD_DIM/DTYPE such as 80/8/128/bfloat16"
        )
    layers, heads, dim, dtype = match.groups()
    return ModelGeometry(text, int(layers), int(heads), int(dim), dtype, "custom geometry")


def replay_bytes_per_token() -> int:
    """Bytes of one token's KV in the replay's pools."""
    return REPLAY_MODEL.kv_shape().bytes_per_token
