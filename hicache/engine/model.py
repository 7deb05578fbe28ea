"""A small Llama-style decoder whose attention reads and writes a paged KV pool."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from device_pool import DeviceKVPool, dtype_from_name
from hicache.config import ModelConfig
from hicache.engine.attention import causal_attention
from hicache.engine.invariant import pad_rows, silu

WaitLayer = Callable[[int], None]


@dataclass(frozen=True)
class ModelSpec:
    """Shape and seed of a ``TinyLlama``. ``num_layers``, ``kv_heads``,
    ``head_dim`` and ``dtype`` (the KV dtype) must match the KV pool the model
    runs on. Weights and activations use ``compute_dtype`` (default: ``dtype``);
    on CPUs without half-precision GEMM, float32 compute with a float16 KV
    cache is orders of magnitude faster."""

    num_layers: int = 2
    num_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    hidden: int = 64
    intermediate: int = 128
    vocab: int = 256
    dtype: str = "float32"
    seed: int = 0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_positions: int = 8192
    attention_block: int = 64  # keys per online-softmax step
    compute_dtype: str | None = None

    def __post_init__(self) -> None:
        dtype_from_name(self.dtype)
        dtype_from_name(self.compute_dtype or self.dtype)
        positive = (self.num_layers, self.num_heads, self.kv_heads, self.head_dim, self.hidden)
        if min(positive) < 1 or min(self.intermediate, self.vocab, self.max_positions) < 1:
            raise ValueError("model dimensions must be >= 1")
        if self.num_heads % self.kv_heads:
            raise ValueError("num_heads must be a multiple of kv_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (rotary embeddings)")
        if self.attention_block < 1:
            raise ValueError("attention_block must be >= 1")

    @classmethod
    def for_cache(
        cls, model: ModelConfig, hidden: int, vocab: int, device: torch.device, seed: int = 0
    ) -> ModelSpec:
        """A spec whose KV geometry is the cache's ``[model]`` section: as many
        query heads as ``hidden`` holds (a multiple of ``kv_heads``), an MLP twice
        as wide, and float32 compute for a half-precision KV cache on CPU."""
        if model.attention != "mha":
            raise ValueError("the engine's model is MHA only")
        heads = max(hidden // model.head_dim // model.kv_heads, 1) * model.kv_heads
        half_on_cpu = device.type == "cpu" and model.dtype != "float32"
        return cls(
            num_layers=model.num_layers,
            num_heads=heads,
            kv_heads=model.kv_heads,
            head_dim=model.head_dim,
            hidden=hidden,
            intermediate=hidden * 2,
            vocab=vocab,
            dtype=model.dtype,
            seed=seed,
            compute_dtype="float32" if half_on_cpu else None,
        )

    def check_pool(self, pool: DeviceKVPool) -> None:
        """ValueError unless ``pool`` stores this model's KV."""
        shape = pool.shape
        ours = (self.num_layers, self.kv_heads, self.head_dim, dtype_from_name(self.dtype))
        theirs = (shape.num_layers, shape.kv_heads, shape.head_dim, shape.dtype)
        if shape.attention != "mha" or ours != theirs:
            raise ValueError(f"KV pool {shape} does not fit model {self}")


class Segment(NamedTuple):
    """One request's share of a forward pass: ``tokens`` at positions
    ``start .. start + len(tokens)``; ``slots`` are the device slots of the whole
    context (``start + len(tokens)`` of them), the last ``len(tokens)`` receive
    the new KV."""

    tokens: torch.Tensor
    start: int
    slots: torch.Tensor


class _Batch(NamedTuple):
    """What every layer of one forward pass needs besides its weights."""

    segments: tuple[Segment, ...]
    new_slots: torch.Tensor  # where the new tokens' KV goes, segment after segment
    cos: torch.Tensor  # rotary tables at the new tokens' positions, [rows, 1, head_dim / 2]
    sin: torch.Tensor
    pool: DeviceKVPool
    wait_layer: WaitLayer


@dataclass(frozen=True)
class _Layer:
    attn_norm: torch.Tensor
    wqkv: torch.Tensor  # [hidden, (heads + 2 * kv_heads) * head_dim]
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate_up: torch.Tensor  # [hidden, 2 * intermediate]
    w_down: torch.Tensor


class TinyLlama:
    """Embedding, RMSNorm, rotary embeddings, grouped-query attention, SwiGLU,
    LM head; random weights drawn from ``spec.seed``. Immutable after
    construction; ``forward`` mutates only the KV pool it is given."""

    def __init__(self, spec: ModelSpec, device: str | torch.device = "cpu") -> None:
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = dtype_from_name(spec.compute_dtype or spec.dtype)
        gen = torch.Generator().manual_seed(spec.seed)
        self._embed = self._weight(gen, (spec.vocab, spec.hidden), 1.0)
        self._layers = tuple(self._layer(gen) for _ in range(spec.num_layers))
        self._final_norm = self._norm(gen)
        self._lm_head = self._weight(gen, (spec.hidden, spec.vocab), spec.hidden**-0.5)
        half = torch.arange(0, spec.head_dim, 2, dtype=torch.float64) / spec.head_dim
        angles = torch.outer(
            torch.arange(spec.max_positions, dtype=torch.float64), spec.rope_theta**-half
        )
        self._cos = angles.cos().float().to(self.device)
        self._sin = angles.sin().float().to(self.device)

    def _weight(self, gen: torch.Generator, shape: tuple[int, int], std: float) -> torch.Tensor:
        w = torch.randn(shape, generator=gen) * std
        return w.to(device=self.device, dtype=self.dtype)

    def _norm(self, gen: torch.Generator) -> torch.Tensor:
        w = 1.0 + 0.1 * torch.randn(self.spec.hidden, generator=gen)
        return w.to(device=self.device, dtype=self.dtype)

    def _layer(self, gen: torch.Generator) -> _Layer:
        s = self.spec
        qkv = (s.num_heads + 2 * s.kv_heads) * s.head_dim
        return _Layer(
            attn_norm=self._norm(gen),
            wqkv=self._weight(gen, (s.hidden, qkv), s.hidden**-0.5),
            wo=self._weight(
                gen, (s.num_heads * s.head_dim, s.hidden), (s.num_heads * s.head_dim) ** -0.5
            ),
            mlp_norm=self._norm(gen),
            w_gate_up=self._weight(gen, (s.hidden, 2 * s.intermediate), s.hidden**-0.5),
            w_down=self._weight(gen, (s.intermediate, s.hidden), s.intermediate**-0.5),
        )

    @torch.inference_mode()
    def forward(
        self, segments: Sequence[Segment], pool: DeviceKVPool, wait_layer: WaitLayer
    ) -> torch.Tensor:
        """Run the new tokens of every segment; write their KV into ``pool``
        (layer by layer, at the segment's last slots) and return the float32
        logits of each segment's last token, ``[len(segments), vocab]``.
        ``wait_layer(i)`` is called before layer i reads KV from the pool."""
        batch = self._batch(segments, pool, wait_layer)
        ids = torch.cat([s.tokens for s in segments]).to(self.device)
        x = pad_rows(self._embed[ids])
        for i, layer in enumerate(self._layers):
            x = self._layer_forward(i, layer, x, batch)
        ends = torch.tensor([len(s.tokens) for s in segments]).cumsum(0) - 1
        last = pad_rows(x[ends.to(self.device)])
        logits = self._rms_norm(last, self._final_norm) @ self._lm_head
        return logits[: len(segments)].float()

    def _batch(self, segments: Sequence[Segment], pool: DeviceKVPool, wait: WaitLayer) -> _Batch:
        if not segments:
            raise ValueError("forward needs at least one segment")
        for seg in segments:
            if len(seg.tokens) < 1 or seg.slots.numel() != seg.start + len(seg.tokens):
                raise ValueError("a segment needs tokens and one slot per context token")
        if max(s.start + len(s.tokens) for s in segments) > self.spec.max_positions:
            raise ValueError(f"position beyond max_positions={self.spec.max_positions}")
        positions = torch.cat([torch.arange(s.start, s.start + len(s.tokens)) for s in segments])
        pos = pad_rows(positions.to(self.device))  # padding rows sit at position 0
        new_slots = torch.cat([s.slots[s.start :] for s in segments])
        cos, sin = self._cos[pos][:, None, :], self._sin[pos][:, None, :]
        return _Batch(tuple(segments), new_slots, cos, sin, pool, wait)

    def _layer_forward(self, index: int, layer: _Layer, x: torch.Tensor, b: _Batch) -> torch.Tensor:
        s = self.spec
        n = len(b.new_slots)
        qkv = self._rms_norm(x, layer.attn_norm) @ layer.wqkv
        q, k, v = qkv.split([s.num_heads * s.head_dim, *[s.kv_heads * s.head_dim] * 2], dim=1)
        q = _rotate(q.reshape(-1, s.num_heads, s.head_dim), b.cos, b.sin).to(self.dtype)
        k = _rotate(k.reshape(-1, s.kv_heads, s.head_dim), b.cos, b.sin)
        b.pool.set_kv(index, b.new_slots, k[:n], v.reshape(-1, s.kv_heads, s.head_dim)[:n])
        b.wait_layer(index)
        attn = self._attend(index, q, b.segments, b.pool)
        x = x + attn @ layer.wo
        gate, up = (self._rms_norm(x, layer.mlp_norm) @ layer.w_gate_up).chunk(2, dim=1)
        return x + (silu(gate) * up) @ layer.w_down

    def _attend(
        self, index: int, q: torch.Tensor, segments: Sequence[Segment], pool: DeviceKVPool
    ) -> torch.Tensor:
        """Paged attention: each segment gathers its context's K/V by slot."""
        k_buf, v_buf = pool.layer_buffers(index)
        outs, row = [], 0
        for seg in segments:
            n = len(seg.tokens)
            ctx = seg.slots.to(k_buf.device)
            out = causal_attention(
                q[row : row + n], k_buf[ctx], v_buf[ctx], seg.start, self.spec.attention_block
            )
            outs.append(out.reshape(n, -1))
            row += n
        return pad_rows(torch.cat(outs).to(self.dtype))

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        scale = torch.sqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.spec.norm_eps)
        return (xf / scale).to(self.dtype) * weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half convention) in float32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
